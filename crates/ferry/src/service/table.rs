//! The service table: how named services and their members are recorded in the group's
//! control block. This module owns the layout; `region::group` only reserves the words.
//!
//! ```text
//!  ServiceArea: SERVICE_WORDS 32-bit atomic words
//!  word 0        lock: 0, or the member word of the domain holding it
//!  word 1        seq: bumped and futex-woken whenever a service is offered or withdrawn
//!  word 16 + i * ENTRY_WORDS   entry i (MAX_SERVICES of them):
//!     +0  state       FREE 0 / LIVE 2
//!     +1  version     bumped every time the entry is claimed
//!     +2  owner       member word of the offering domain
//!     +3  owner_gen   its full generation
//!     +4  kind        1 publish-subscribe, 2 request-response
//!     +5  policy      0 drop, 1 block (publish-subscribe)
//!     +6  depth       queue depth per member (a power of two)
//!     +7  join        futex word: bumped and woken by every member that joins
//!     +8  name_len    1..=64
//!     +9..+25         name, UTF-8, 64 bytes
//!     +32..+96        members: MAX_MEMBERS member words, 0 when free
//!  word NOTES + i * NOTE_WORDS   entry i's bridge note (see below):
//!     +0  seq         odd while its writer writes it
//!     +1  role        0 none, 1 imported (written by the owner), 2 carried (by a member)
//!     +2  writer      member word of the domain that wrote it
//!     +3  writer_gen  its full generation
//!     +4  version     the entry's version it was written for
//!     +5  len         0..=MAX_FAR
//!     +6..+31         the far end, UTF-8 without control characters, 100 bytes
//! ```
//!
//! A *member word* names a domain in one 32-bit word: `slot + 1` in bits 0..8 and the low
//! 24 bits of its generation above. A member word is only ever a hint: every reader
//! checks that the slot holds a live domain of that generation (pidfd liveness, as for
//! slots) before it acts on it, so the word of a dead domain is simply free.
//!
//! Offering and withdrawing take the table lock (held for a few hundred nanoseconds;
//! a holder that died is overtaken), so that two domains cannot both claim one name.
//! Joining and leaving do not: a member claims a free (or dead) member word of the
//! entry with a compare-and-swap and wakes the owner through the entry's `join` word.
//!
//! Every member of the group maps this table writable and may scribble over it. So every
//! value read is checked (state, kind, policy, depth, name length and UTF-8, owner slot
//! and liveness), an entry whose version changes while it is read is read again (a few
//! times, then skipped), a lock that stays held by a live domain gives
//! [`Error::BadServiceTable`] after [`LOCK_PATIENCE`], and waits are bounded by the
//! caller's timeout. Nothing read here is ever used as an index or a length unchecked.
//!
//! A *bridge note* says what a bridge (`ferry-bridge`) does with a service: its owner
//! imports it from another host, or one of its members carries it to others. It is
//! only ever shown ([`ServiceInfo::origin`](super::ServiceInfo::origin)), never used
//! to decide anything. A note counts only while the entry is the one it was written
//! for and its writer is alive and the entry's owner (imported) or one of its members
//! (carried): a stale note (its writer died or left, the name was offered again) is
//! no note. One whose writer is entitled but whose fields fail the checks (role,
//! length, UTF-8, control characters, a write that never ends) reads as damaged.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::region::group::{Member, SERVICE_WORDS};
use crate::region::{DomainId, Group};
use crate::sys::futex;

/// Services one group can offer at once.
pub const MAX_SERVICES: usize = 64;
/// Members (subscribers or clients) one service can have at once.
pub const MAX_MEMBERS: usize = 64;
/// Longest service name, in bytes.
pub const MAX_NAME: usize = 64;

const LOCK: usize = 0;
const SEQ: usize = 1;
const FIRST: usize = 16;
const ENTRY_WORDS: usize = 96;

const E_STATE: usize = 0;
const E_VERSION: usize = 1;
const E_OWNER: usize = 2;
const E_OWNER_GEN: usize = 3;
const E_KIND: usize = 4;
const E_POLICY: usize = 5;
const E_DEPTH: usize = 6;
const E_JOIN: usize = 7;
const E_NAME_LEN: usize = 8;
const E_NAME: usize = 9;
const E_MEMBERS: usize = 32;

const FREE: u32 = 0;
const LIVE: u32 = 2;

/// Where the bridge notes start: one per entry, after the entries.
const NOTES: usize = FIRST + MAX_SERVICES * ENTRY_WORDS;
const NOTE_WORDS: usize = 31;
const N_SEQ: usize = 0;
const N_ROLE: usize = 1;
const N_WRITER: usize = 2;
const N_WRITER_GEN: usize = 3;
const N_VERSION: usize = 4;
const N_LEN: usize = 5;
const N_TEXT: usize = 6;
/// Longest far-end description a bridge note holds, in bytes.
pub const MAX_FAR: usize = (NOTE_WORDS - N_TEXT) * 4;

/// How long offering or withdrawing waits for the table lock.
pub(crate) const LOCK_PATIENCE: Duration = Duration::from_secs(2);

const _: () = assert!(FIRST + MAX_SERVICES * ENTRY_WORDS <= SERVICE_WORDS);
const _: () = assert!(E_NAME + MAX_NAME / 4 <= E_MEMBERS);
const _: () = assert!(E_MEMBERS + MAX_MEMBERS <= ENTRY_WORDS);
const _: () = assert!(NOTES + MAX_SERVICES * NOTE_WORDS <= SERVICE_WORDS);

/// What a bridge note says (see the module docs).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// No note (clears one).
    None,
    /// The owner imports the service from the far end.
    Imported,
    /// The writer, a member, carries the service to the far end.
    Carried,
}

impl Role {
    fn word(self) -> u32 {
        match self {
            Role::None => 0,
            Role::Imported => 1,
            Role::Carried => 2,
        }
    }
}

/// A bridge note as read and validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Note {
    /// No note, or a stale one.
    None,
    /// The owner imports the service from `far`.
    Imported { far: String },
    /// Member `by` carries it to `to`.
    Carried { by: Member, to: String },
    /// A note by an entitled writer that fails validation.
    Damaged,
}

/// Word offset of entry `i`'s bridge note inside the service area.
#[cfg(any(test, feature = "testing"))]
pub(crate) fn note_offset(i: usize) -> usize {
    NOTES + i * NOTE_WORDS
}

/// Checks a far-end description before it is written: at most [`MAX_FAR`] bytes, no
/// control characters (it ends up on terminals).
pub(crate) fn check_far(far: &str) -> Result<()> {
    if far.len() > MAX_FAR || far.chars().any(char::is_control) {
        return Err(Error::InvalidArgument(
            "a far end is at most 100 bytes of UTF-8 without control characters",
        ));
    }
    Ok(())
}

/// What a service carries.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// One publisher, up to [`MAX_MEMBERS`] subscribers.
    PubSub,
    /// One server, up to [`MAX_MEMBERS`] clients.
    ReqResp,
}

impl Kind {
    fn word(self) -> u32 {
        match self {
            Kind::PubSub => 1,
            Kind::ReqResp => 2,
        }
    }
    fn from_word(w: u32) -> Option<Kind> {
        match w {
            1 => Some(Kind::PubSub),
            2 => Some(Kind::ReqResp),
            _ => None,
        }
    }
}

/// The member word of domain `id`.
pub(crate) fn member_word(id: DomainId) -> u32 {
    (id.slot as u32 + 1) | (id.generation & 0x00ff_ffff) << 8
}

/// One entry as read and validated.
#[derive(Clone, Debug)]
pub(crate) struct EntryView {
    pub index: usize,
    pub version: u32,
    pub owner: Member,
    pub kind: Kind,
    pub block: bool,
    pub depth: u32,
    pub name: String,
}

/// A view of the service table of one group.
pub(crate) struct Table<'g> {
    group: &'g Group,
    w: &'g [AtomicU32; SERVICE_WORDS],
}

impl<'g> Table<'g> {
    pub fn new(group: &'g Group) -> Self {
        Table {
            group,
            w: group.service_words(),
        }
    }

    fn word(&self, entry: usize, field: usize) -> &'g AtomicU32 {
        &self.w[FIRST + entry * ENTRY_WORDS + field]
    }

    fn note_word(&self, entry: usize, field: usize) -> &'g AtomicU32 {
        &self.w[NOTES + entry * NOTE_WORDS + field]
    }

    /// Writes entry `i`'s bridge note as `me` (its owner or a member: readers check),
    /// for the entry's `version`. `far` was checked ([`check_far`]).
    pub fn write_note(&self, i: usize, version: u32, me: DomainId, role: Role, far: &str) {
        let seq = self.note_word(i, N_SEQ);
        // Odd while written; a writer that died half-way left it odd, which is taken over.
        let odd = seq.load(Ordering::Relaxed) | 1;
        seq.store(odd, Ordering::Relaxed);
        // SYNC: the odd seq is visible before any field below (seqlock writer).
        std::sync::atomic::fence(Ordering::Release);
        let put = |f: usize, v: u32| self.note_word(i, f).store(v, Ordering::Relaxed);
        put(N_ROLE, role.word());
        put(N_WRITER, member_word(me));
        put(N_WRITER_GEN, me.generation);
        put(N_VERSION, version);
        let mut bytes = [0u8; MAX_FAR];
        let len = far.len().min(MAX_FAR);
        bytes[..len].copy_from_slice(&far.as_bytes()[..len]);
        for (k, chunk) in bytes.chunks_exact(4).enumerate() {
            put(
                N_TEXT + k,
                u32::from_ne_bytes(chunk.try_into().expect("4 bytes")),
            );
        }
        put(N_LEN, len as u32);
        // SYNC: pairs with the Acquire load of seq in `note`: the fields are visible
        // before the even seq.
        seq.store(odd.wrapping_add(1), Ordering::Release);
    }

    /// Clears entry `i`'s bridge note if `me` wrote it for `version`.
    pub fn clear_note(&self, i: usize, version: u32, me: DomainId) {
        if self.note_word(i, N_WRITER).load(Ordering::Acquire) == member_word(me)
            && self.note_word(i, N_VERSION).load(Ordering::Relaxed) == version
        {
            self.write_note(i, version, me, Role::None, "");
        }
    }

    /// Entry `e`'s bridge note, checked against the entry and its live `members`.
    pub fn note(&self, e: &EntryView, members: &[Member]) -> Note {
        let get = |f: usize| self.note_word(e.index, f).load(Ordering::Relaxed);
        for _ in 0..4 {
            // SYNC: pairs with the Release store of the even seq in `write_note`.
            let s1 = self.note_word(e.index, N_SEQ).load(Ordering::Acquire);
            if s1 & 1 == 1 {
                std::thread::yield_now();
                continue;
            }
            let (role, writer, writer_gen, version) = (
                get(N_ROLE),
                get(N_WRITER),
                get(N_WRITER_GEN),
                get(N_VERSION),
            );
            let len = get(N_LEN) as usize;
            let mut bytes = [0u8; MAX_FAR];
            for (k, chunk) in bytes.chunks_exact_mut(4).enumerate() {
                chunk.copy_from_slice(&get(N_TEXT + k).to_ne_bytes());
            }
            // SYNC: the fields above were read before this second load of seq.
            std::sync::atomic::fence(Ordering::Acquire);
            if self.note_word(e.index, N_SEQ).load(Ordering::Relaxed) != s1 {
                continue;
            }
            if role == Role::None.word() || version != e.version {
                return Note::None;
            }
            // A writer that is gone (or never was) leaves no note.
            let Some(by) = self
                .resolve(writer)
                .filter(|m| m.id.generation == writer_gen)
            else {
                return Note::None;
            };
            if !(1..=MAX_FAR).contains(&len) {
                return Note::Damaged;
            }
            let Some(far) = std::str::from_utf8(&bytes[..len])
                .ok()
                .filter(|t| !t.chars().any(char::is_control))
                .map(str::to_owned)
            else {
                return Note::Damaged;
            };
            return match role {
                1 if by.id == e.owner.id => Note::Imported { far },
                2 if members.contains(&by) => Note::Carried { by, to: far },
                _ => Note::Damaged,
            };
        }
        // Still being written: a note of an older claim of the entry is no note.
        if get(N_VERSION) != e.version {
            Note::None
        } else {
            Note::Damaged
        }
    }

    /// The live domain a member word names, if any.
    fn resolve(&self, w: u32) -> Option<Member> {
        let slot = (w & 0xff).checked_sub(1)?;
        self.group.live_domain_like(slot as u16, w >> 8)
    }

    /// The futex word bumped when a member joins entry `i`.
    pub fn join_word(&self, i: usize) -> &'g AtomicU32 {
        self.word(i, E_JOIN)
    }

    /// The table's sequence word (offers and withdrawals).
    pub fn seq(&self) -> u32 {
        self.w[SEQ].load(Ordering::Acquire)
    }

    /// Waits up to `timeout` for the table's sequence word to move on from `seen`.
    pub fn wait_seq(&self, seen: u32, timeout: Duration) {
        futex::wait(&self.w[SEQ], seen, timeout);
    }

    fn bump_seq(&self) {
        self.w[SEQ].fetch_add(1, Ordering::AcqRel);
        futex::wake_all(&self.w[SEQ]);
    }

    /// Reads entry `i`: `Ok(None)` if free (or its owner is dead), `Err` if it does not
    /// validate.
    pub fn read(&self, i: usize) -> Result<Option<EntryView>, &'static str> {
        for _ in 0..4 {
            // SYNC: pairs with the Release store of LIVE in `offer`.
            let v1 = self.word(i, E_VERSION).load(Ordering::Acquire);
            let state = self.word(i, E_STATE).load(Ordering::Acquire);
            if state == FREE {
                return Ok(None);
            }
            let got = self.read_fields(i, state, v1);
            // SYNC: the fields above were read before this second load of the version.
            std::sync::atomic::fence(Ordering::Acquire);
            if self.word(i, E_VERSION).load(Ordering::Relaxed) == v1 {
                return got;
            }
        }
        Err("entry kept changing while read")
    }

    fn read_fields(
        &self,
        i: usize,
        state: u32,
        version: u32,
    ) -> Result<Option<EntryView>, &'static str> {
        if state != LIVE {
            return Err("bad entry state");
        }
        let get = |f: usize| self.word(i, f).load(Ordering::Relaxed);
        let kind = Kind::from_word(get(E_KIND)).ok_or("bad service kind")?;
        let block = match get(E_POLICY) {
            0 => false,
            1 => true,
            _ => return Err("bad slow-subscriber policy"),
        };
        let depth = get(E_DEPTH);
        if !depth.is_power_of_two() || !(2..=1 << 16).contains(&depth) {
            return Err("bad queue depth");
        }
        let len = get(E_NAME_LEN) as usize;
        if !(1..=MAX_NAME).contains(&len) {
            return Err("bad name length");
        }
        let mut bytes = [0u8; MAX_NAME];
        for (k, chunk) in bytes.chunks_exact_mut(4).enumerate() {
            chunk.copy_from_slice(&get(E_NAME + k).to_ne_bytes());
        }
        let name = std::str::from_utf8(&bytes[..len])
            .map_err(|_| "name is not UTF-8")?
            .to_owned();
        let owner_word = get(E_OWNER);
        let owner_gen = get(E_OWNER_GEN);
        let slot = (owner_word & 0xff).checked_sub(1).ok_or("bad owner")?;
        if slot as usize >= crate::region::group::MAX_SLOTS
            || owner_word >> 8 != owner_gen & 0x00ff_ffff
        {
            return Err("bad owner");
        }
        let Some(owner) = self
            .resolve(owner_word)
            .filter(|m| m.id.generation == owner_gen)
        else {
            // The owner died (or its slot was taken over): the entry is free to reclaim.
            return Ok(None);
        };
        Ok(Some(EntryView {
            index: i,
            version,
            owner,
            kind,
            block,
            depth,
            name,
        }))
    }

    /// Every live, valid entry; entries that fail validation are counted in the second
    /// value.
    pub fn entries(&self) -> (Vec<EntryView>, usize) {
        let mut bad = 0;
        let mut out = Vec::new();
        for i in 0..MAX_SERVICES {
            match self.read(i) {
                Ok(Some(e)) => out.push(e),
                Ok(None) => {}
                Err(_) => bad += 1,
            }
        }
        (out, bad)
    }

    /// The live entry named `name`, if any.
    pub fn find(&self, name: &str) -> Option<EntryView> {
        (0..MAX_SERVICES)
            .filter_map(|i| self.read(i).ok().flatten())
            .find(|e| e.name == name)
    }

    /// Claims an entry for service `name` owned by `me`. Returns its index and version.
    ///
    /// # Errors
    /// [`Error::ServiceExists`] if a live domain offers `name` already,
    /// [`Error::ServiceTableFull`], or [`Error::BadServiceTable`] if the lock stayed held.
    pub fn offer(
        &self,
        me: DomainId,
        name: &str,
        kind: Kind,
        block: bool,
        depth: u32,
    ) -> Result<(usize, u32)> {
        let _lock = self.lock(me)?;
        let mut spare = None;
        for i in 0..MAX_SERVICES {
            match self.read(i) {
                Ok(Some(e)) if e.name == name => {
                    return Err(Error::ServiceExists {
                        name: name.to_owned(),
                    })
                }
                Ok(Some(_)) => {}
                // Free, dead or garbage: reusable (under the lock nobody else claims it).
                Ok(None) | Err(_) => {
                    spare.get_or_insert(i);
                }
            }
        }
        let i = spare.ok_or(Error::ServiceTableFull)?;
        let put = |f: usize, v: u32| self.word(i, f).store(v, Ordering::Relaxed);
        // Readers seeing the version move re-read; a reader that sees FREE skips.
        self.word(i, E_STATE).store(FREE, Ordering::Release);
        let version = self
            .word(i, E_VERSION)
            .fetch_add(1, Ordering::AcqRel)
            .wrapping_add(1);
        put(E_OWNER, member_word(me));
        put(E_OWNER_GEN, me.generation);
        put(E_KIND, kind.word());
        put(E_POLICY, block as u32);
        put(E_DEPTH, depth);
        let mut bytes = [0u8; MAX_NAME];
        bytes[..name.len()].copy_from_slice(name.as_bytes());
        for (k, chunk) in bytes.chunks_exact(4).enumerate() {
            put(
                E_NAME + k,
                u32::from_ne_bytes(chunk.try_into().expect("4 bytes")),
            );
        }
        put(E_NAME_LEN, name.len() as u32);
        for m in 0..MAX_MEMBERS {
            put(E_MEMBERS + m, 0);
        }
        self.write_note(i, version, me, Role::None, "");
        // SYNC: pairs with the Acquire loads of state and version in `read`.
        self.word(i, E_STATE).store(LIVE, Ordering::Release);
        self.bump_seq();
        Ok((i, version))
    }

    /// True if entry `i` is live and still the claim `version`.
    pub fn current(&self, i: usize, version: u32) -> bool {
        self.word(i, E_VERSION).load(Ordering::Acquire) == version
            && self.word(i, E_STATE).load(Ordering::Acquire) == LIVE
    }

    /// True if entry `i` is still the one `me` claimed as `version`.
    pub fn owned(&self, i: usize, version: u32, me: DomainId) -> bool {
        self.word(i, E_VERSION).load(Ordering::Acquire) == version
            && self.word(i, E_STATE).load(Ordering::Acquire) == LIVE
            && self.word(i, E_OWNER).load(Ordering::Relaxed) == member_word(me)
            && self.word(i, E_OWNER_GEN).load(Ordering::Relaxed) == me.generation
    }

    /// Frees entry `i` if it is still the one `me` claimed as `version`.
    pub fn withdraw(&self, i: usize, version: u32, me: DomainId) {
        // Without the lock (held by a hostile member), still free our own entry: a
        // concurrent offer only ever claims entries that read as free or dead.
        let _lock = self.lock(me).ok();
        if self.owned(i, version, me) {
            self.word(i, E_STATE).store(FREE, Ordering::Release);
            self.word(i, E_VERSION).fetch_add(1, Ordering::AcqRel);
            self.bump_seq();
        }
    }

    /// Records `me` as a member of entry `e`, and wakes its owner. Returns the index of
    /// the member word.
    ///
    /// # Errors
    /// [`Error::AlreadyMember`] or [`Error::ServiceFull`].
    pub fn join(&self, e: &EntryView, me: DomainId) -> Result<usize> {
        let mine = member_word(me);
        let words = || (0..MAX_MEMBERS).map(|m| (m, self.word(e.index, E_MEMBERS + m)));
        if words().any(|(_, w)| w.load(Ordering::Acquire) == mine) {
            return Err(Error::AlreadyMember {
                name: e.name.clone(),
            });
        }
        for (m, w) in words() {
            let cur = w.load(Ordering::Acquire);
            if (cur == 0 || self.resolve(cur).is_none())
                && w.compare_exchange(cur, mine, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                let join = self.join_word(e.index);
                join.fetch_add(1, Ordering::AcqRel);
                futex::wake_all(join);
                return Ok(m);
            }
        }
        Err(Error::ServiceFull {
            name: e.name.clone(),
        })
    }

    /// Clears member word `m` of entry `i` if it still names `me`.
    pub fn leave(&self, i: usize, m: usize, me: DomainId) {
        if m < MAX_MEMBERS {
            let _ = self.word(i, E_MEMBERS + m).compare_exchange(
                member_word(me),
                0,
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
        }
    }

    /// The live members of entry `i`, and clears the words of dead ones (unless the group
    /// is only being looked at).
    pub fn members(&self, i: usize) -> Vec<Member> {
        let mut out = Vec::new();
        for m in 0..MAX_MEMBERS {
            let w = self.word(i, E_MEMBERS + m);
            let cur = w.load(Ordering::Acquire);
            if cur == 0 {
                continue;
            }
            match self.resolve(cur) {
                Some(d) if !out.contains(&d) => out.push(d),
                Some(_) => {}
                // A group opened to be looked at maps the table read-only.
                None if self.group.read_only() => {}
                None => {
                    let _ = w.compare_exchange(cur, 0, Ordering::AcqRel, Ordering::Relaxed);
                }
            }
        }
        out
    }

    /// Takes the table lock for `me`, overtaking a dead holder.
    fn lock(&self, me: DomainId) -> Result<TableLock<'g>> {
        let mine = member_word(me);
        let lock = &self.w[LOCK];
        let deadline = Instant::now() + LOCK_PATIENCE;
        loop {
            let cur = lock.load(Ordering::Acquire);
            let free = cur == 0 || self.resolve(cur).is_none();
            if free
                && lock
                    .compare_exchange(cur, mine, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                return Ok(TableLock { word: lock, mine });
            }
            if Instant::now() >= deadline {
                return Err(Error::BadServiceTable("the table lock stayed held"));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// The table lock, released on drop.
struct TableLock<'g> {
    word: &'g AtomicU32,
    mine: u32,
}

impl Drop for TableLock<'_> {
    fn drop(&mut self) {
        // SYNC: Release: what we wrote under the lock is visible to the next holder.
        let _ = self
            .word
            .compare_exchange(self.mine, 0, Ordering::Release, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_words_round_trip() {
        let id = DomainId {
            slot: 63,
            generation: 0x1234_5678,
        };
        let w = member_word(id);
        assert_eq!(w & 0xff, 64);
        assert_eq!(w >> 8, 0x34_5678);
        assert_ne!(
            member_word(DomainId {
                slot: 0,
                generation: 0
            }),
            0
        );
    }

    #[test]
    fn garbage_entries_fail_validation_without_panicking() {
        let g = Group::open(&format!("unit-svc-garbage-{}", std::process::id())).unwrap();
        let d = g.join().unwrap();
        let t = Table::new(&g);
        let (i, _) = t.offer(d.id(), "a/b", Kind::PubSub, false, 8).unwrap();
        assert_eq!(t.find("a/b").unwrap().index, i);
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        for round in 0..200 {
            for w in g.service_words().iter() {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                // Mostly small values, so that some fields look almost right.
                let v = if round % 2 == 0 {
                    rng as u32
                } else {
                    (rng % 5) as u32
                };
                w.store(v, Ordering::Relaxed);
            }
            let (_, _) = t.entries();
            let _ = t.find("a/b");
            for e in 0..MAX_SERVICES {
                let _ = t.members(e);
            }
        }
        for w in g.service_words().iter() {
            w.store(0, Ordering::Relaxed);
        }
        assert!(t.find("a/b").is_none());
        drop(d);
    }
}
