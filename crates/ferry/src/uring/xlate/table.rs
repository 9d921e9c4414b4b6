//! The user-level table of registered ranges: which page-aligned address ranges sit in
//! which buffer slot, in LRU order, with a count of I/O in flight per slot.
//!
//! Pure bookkeeping, no system calls: the caller ([`super::Xlate`]) installs and clears
//! the kernel's slots. This is the paper's "user-maintained page table" looked up on the
//! host CPU before each transfer; a sorted array by start address stands in for its
//! three-level table, and an intrusive doubly-linked list over slot indices keeps the LRU
//! order.
//!
//! After [`Table::new`] nothing here allocates or frees memory. That matters: the table
//! is used under a lock that the unmap monitor also needs, and `free` may trim the heap
//! (`brk`, `madvise`), which on a watched range makes the freeing thread wait for the
//! monitor. Freeing under the lock could therefore deadlock.

/// No slot (end of an LRU list).
const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Never used, or its entry was dropped and the kernel slot may be reused.
    Free,
    /// Maps `[start, end)`.
    Live,
    /// Invalidated while I/O was in flight on it: reusable once `inflight` drops to zero.
    Stale,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    state: State,
    start: usize,
    end: usize,
    inflight: u32,
    /// LRU neighbours (towards least / most recently used); live slots only.
    prev: u32,
    next: u32,
}

const FREE: Slot = Slot {
    state: State::Free,
    start: 0,
    end: 0,
    inflight: 0,
    prev: NIL,
    next: NIL,
};

/// The result of a successful [`Table::lookup`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hit {
    /// Cache slot index (0-based within the cache's part of the kernel table).
    pub slot: u32,
    /// Start of the registered range (the address the kernel slot begins at).
    pub start: usize,
}

/// Where a new range may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Victim {
    /// The slot to install into.
    pub slot: u32,
    /// Whether a live entry had to be evicted for it.
    pub evicted: bool,
}

/// LRU table of registered ranges.
#[derive(Debug)]
pub struct Table {
    slots: Vec<Slot>,
    /// Live entries as (start, slot), sorted; capacity reserved for every slot.
    by_addr: Vec<(usize, u32)>,
    /// Least recently used live slot.
    head: u32,
    /// Most recently used live slot.
    tail: u32,
    /// Longest live range ever inserted, to bound the backward scans.
    max_len: usize,
}

impl Table {
    /// A table of `slots` empty slots.
    pub fn new(slots: u32) -> Table {
        Table {
            slots: vec![FREE; slots as usize],
            by_addr: Vec::with_capacity(slots as usize),
            head: NIL,
            tail: NIL,
            max_len: 0,
        }
    }

    /// Number of live (valid) entries.
    pub fn live(&self) -> usize {
        self.by_addr.len()
    }

    /// Finds a live entry that covers `[addr, addr + len)`; on a hit, marks it most
    /// recently used and counts one more I/O in flight on it (undo with [`Table::done`]).
    pub fn lookup(&mut self, addr: usize, len: usize) -> Option<Hit> {
        let end = addr.checked_add(len)?;
        let floor = end.saturating_sub(self.max_len);
        let upto = self.by_addr.partition_point(|&(s, _)| s <= addr);
        let (start, slot) = self.by_addr[..upto]
            .iter()
            .rev()
            .take_while(|&&(s, _)| s >= floor)
            .find(|&&(_, slot)| self.slots[slot as usize].end >= end)
            .copied()?;
        self.unlink(slot);
        self.push_tail(slot);
        self.slots[slot as usize].inflight += 1;
        Some(Hit { slot, start })
    }

    /// One I/O on `slot` (from a [`Table::lookup`] hit or an [`Table::insert`]) completed.
    pub fn done(&mut self, slot: u32) {
        let s = &mut self.slots[slot as usize];
        s.inflight = s.inflight.saturating_sub(1);
        if s.state == State::Stale && s.inflight == 0 {
            *s = FREE;
        }
    }

    /// Picks a slot for a new range: a free one if any, else the least recently used live
    /// entry with no I/O in flight. `None` when every slot has I/O in flight.
    ///
    /// The caller installs the range in the kernel slot and then calls [`Table::insert`];
    /// an evicted entry is dropped here, before the kernel slot is overwritten.
    pub fn victim(&mut self) -> Option<Victim> {
        if let Some(i) = self.slots.iter().position(|s| s.state == State::Free) {
            return Some(Victim {
                slot: i as u32,
                evicted: false,
            });
        }
        let mut at = self.head;
        while at != NIL && self.slots[at as usize].inflight != 0 {
            at = self.slots[at as usize].next;
        }
        if at == NIL {
            return None;
        }
        self.remove(at);
        self.slots[at as usize] = FREE;
        Some(Victim {
            slot: at,
            evicted: true,
        })
    }

    /// Records that `slot` (from [`Table::victim`]) now maps `[start, end)`; the entry is
    /// most recently used, with `inflight` I/Os already counted on it.
    pub fn insert(&mut self, slot: u32, start: usize, end: usize, inflight: u32) {
        debug_assert_eq!(self.slots[slot as usize].state, State::Free);
        self.slots[slot as usize] = Slot {
            state: State::Live,
            start,
            end,
            inflight,
            prev: NIL,
            next: NIL,
        };
        let at = self.by_addr.partition_point(|&e| e < (start, slot));
        // No reallocation: the capacity covers every slot.
        self.by_addr.insert(at, (start, slot));
        self.push_tail(slot);
        self.max_len = self.max_len.max(end - start);
    }

    /// Drops every live entry that overlaps `[start, end)`; returns how many.
    ///
    /// A dropped slot with no I/O in flight becomes free at once; one with I/O in flight
    /// becomes stale and free when the last of that I/O is [`Table::done`].
    pub fn invalidate(&mut self, start: usize, end: usize) -> usize {
        let floor = start.saturating_sub(self.max_len);
        let mut i = self.by_addr.partition_point(|&(s, _)| s < end);
        let mut n = 0;
        while i > 0 {
            i -= 1;
            let (s, slot) = self.by_addr[i];
            if s < floor {
                break;
            }
            if self.slots[slot as usize].end > start {
                self.by_addr.remove(i);
                self.unlink(slot);
                let e = &mut self.slots[slot as usize];
                if e.inflight == 0 {
                    *e = FREE;
                } else {
                    e.state = State::Stale;
                }
                n += 1;
            }
        }
        n
    }

    /// Drops every live entry (for example when the watcher stops); returns how many.
    pub fn invalidate_all(&mut self) -> usize {
        self.invalidate(0, usize::MAX)
    }

    /// Unlinks a live slot from both indexes.
    fn remove(&mut self, slot: u32) {
        let key = (self.slots[slot as usize].start, slot);
        if let Ok(i) = self.by_addr.binary_search(&key) {
            self.by_addr.remove(i);
        }
        self.unlink(slot);
    }

    fn unlink(&mut self, slot: u32) {
        let Slot { prev, next, .. } = self.slots[slot as usize];
        match prev {
            NIL if self.head == slot => self.head = next,
            NIL => {}
            p => self.slots[p as usize].next = next,
        }
        match next {
            NIL if self.tail == slot => self.tail = prev,
            NIL => {}
            n => self.slots[n as usize].prev = prev,
        }
        let s = &mut self.slots[slot as usize];
        s.prev = NIL;
        s.next = NIL;
    }

    fn push_tail(&mut self, slot: u32) {
        let old = self.tail;
        {
            let s = &mut self.slots[slot as usize];
            s.prev = old;
            s.next = NIL;
        }
        if old == NIL {
            self.head = slot;
        } else {
            self.slots[old as usize].next = slot;
        }
        self.tail = slot;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: usize = 4096;

    fn fill(t: &mut Table, n: usize) {
        for i in 0..n {
            let v = t.victim().unwrap();
            t.insert(v.slot, i * P, (i + 1) * P, 0);
        }
    }

    #[test]
    fn lookup_finds_covering_ranges_only() {
        let mut t = Table::new(4);
        t.insert(0, 2 * P, 4 * P, 0);
        assert_eq!(t.lookup(2 * P + 10, 100).map(|h| h.slot), Some(0));
        t.done(0);
        assert_eq!(t.lookup(4 * P - 1, 1).map(|h| h.start), Some(2 * P));
        t.done(0);
        assert!(t.lookup(4 * P - 1, 2).is_none(), "runs past the end");
        assert!(t.lookup(2 * P - 1, 2).is_none(), "starts before");
        assert!(t.lookup(0, 1).is_none());
    }

    #[test]
    fn eviction_is_lru() {
        let mut t = Table::new(3);
        fill(&mut t, 3);
        // Use 0 and 2; slot 1 becomes least recently used.
        t.lookup(0, 1).unwrap();
        t.done(0);
        t.lookup(2 * P, 1).unwrap();
        t.done(2);
        let v = t.victim().unwrap();
        assert_eq!(
            v,
            Victim {
                slot: 1,
                evicted: true
            }
        );
        assert!(t.lookup(P, 1).is_none(), "the evicted range no longer hits");
    }

    #[test]
    fn eviction_never_takes_a_slot_with_io_in_flight() {
        let mut t = Table::new(3);
        fill(&mut t, 3);
        // Slot 0 is least recently used but has I/O in flight.
        let h = t.lookup(0, 1).unwrap();
        assert_eq!(h.slot, 0);
        for (slot, addr) in [(1, P), (2, 2 * P)] {
            t.lookup(addr, 1).unwrap();
            t.done(slot);
        }
        // Slot 0 is now the least recently used, and busy.
        let v = t.victim().unwrap();
        assert_ne!(v.slot, 0, "slot 0 has I/O in flight");
        t.insert(v.slot, 10 * P, 11 * P, 1);
        // Fill the last idle slot with another busy entry: now nothing may be evicted.
        let v2 = t.victim().unwrap();
        assert_ne!(v2.slot, 0);
        assert_ne!(v2.slot, v.slot);
        t.insert(v2.slot, 20 * P, 21 * P, 1);
        assert_eq!(t.victim(), None, "every slot has I/O in flight");
        t.done(0);
        assert_eq!(t.victim().map(|v| v.slot), Some(0));
    }

    #[test]
    fn invalidation_drops_overlapping_entries_and_defers_busy_slots() {
        let mut t = Table::new(4);
        fill(&mut t, 4);
        let h = t.lookup(2 * P, 8).unwrap(); // in flight on slot 2
        assert_eq!(t.invalidate(P + 100, 2 * P + 1), 2); // slots 1 and 2
        assert!(t.lookup(P, 1).is_none());
        assert!(t.lookup(2 * P, 1).is_none());
        assert_eq!(t.live(), 2);
        // Slot 1 is free now; slot 2 only after its I/O completes.
        assert_eq!(t.victim().map(|v| v.slot), Some(1));
        t.insert(1, 50 * P, 51 * P, 0);
        assert!(
            t.victim().unwrap().evicted,
            "slot 2 is still stale and busy"
        );
        let mut t2 = Table::new(4);
        fill(&mut t2, 4);
        let h2 = t2.lookup(3 * P, 1).unwrap();
        t2.invalidate(3 * P, 4 * P);
        t2.done(h2.slot);
        assert_eq!(
            t2.victim(),
            Some(Victim {
                slot: 3,
                evicted: false
            })
        );
        let _ = h;
    }

    #[test]
    fn overlapping_entries_are_all_invalidated() {
        let mut t = Table::new(4);
        t.insert(0, 0, 2 * P, 0);
        t.insert(1, P, 3 * P, 0);
        t.insert(2, 5 * P, 6 * P, 0);
        assert_eq!(t.invalidate(P, P + 1), 2);
        assert_eq!(t.live(), 1);
        assert_eq!(t.invalidate_all(), 1);
        assert_eq!(t.live(), 0);
    }

    /// Random operations against a naive model: lookups, LRU victims, in-flight counts
    /// and invalidations must agree.
    #[test]
    fn agrees_with_a_naive_model() {
        #[derive(Clone, Copy)]
        struct M {
            start: usize,
            end: usize,
            stamp: u64,
            inflight: u32,
            live: bool,
            /// Invalidated with I/O in flight: not free until done.
            stale: bool,
        }
        let mut rng = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let n = 8u32;
        let mut t = Table::new(n);
        let mut m = vec![
            M {
                start: 0,
                end: 0,
                stamp: 0,
                inflight: 0,
                live: false,
                stale: false
            };
            n as usize
        ];
        let mut clock = 0u64;
        let mut pending: Vec<u32> = Vec::new();
        let (mut hits, mut evictions, mut stale, mut full) = (0, 0, 0, 0);
        for _ in 0..20_000 {
            match next(4) {
                0 => {
                    let addr = next(64) as usize * 512;
                    let len = 1 + next(3 * 4096) as usize;
                    let covers = m
                        .iter()
                        .any(|e| e.live && e.start <= addr && e.end >= addr + len);
                    let got = t.lookup(addr, len);
                    assert_eq!(got.is_some(), covers, "lookup {addr:#x}+{len}");
                    if let Some(h) = got {
                        hits += 1;
                        let e = &mut m[h.slot as usize];
                        assert!(e.live && e.start <= addr && e.end >= addr + len);
                        assert_eq!(h.start, e.start);
                        clock += 1;
                        e.stamp = clock;
                        e.inflight += 1;
                        pending.push(h.slot);
                    }
                }
                1 => {
                    let free = m.iter().position(|e| !e.live && !e.stale);
                    let lru = m
                        .iter()
                        .enumerate()
                        .filter(|(_, e)| e.live && e.inflight == 0)
                        .min_by_key(|(_, e)| e.stamp)
                        .map(|(i, _)| i);
                    let v = t.victim();
                    match (free, lru) {
                        (Some(f), _) => assert_eq!(
                            v,
                            Some(Victim {
                                slot: f as u32,
                                evicted: false
                            })
                        ),
                        (None, Some(l)) => {
                            evictions += 1;
                            assert_eq!(
                                v,
                                Some(Victim {
                                    slot: l as u32,
                                    evicted: true
                                })
                            )
                        }
                        (None, None) => {
                            full += 1;
                            assert_eq!(v, None)
                        }
                    }
                    if let Some(v) = v {
                        let start = next(64) as usize * 4096;
                        let end = start + 4096 * (1 + next(3) as usize);
                        let busy = next(2) as u32;
                        t.insert(v.slot, start, end, busy);
                        clock += 1;
                        m[v.slot as usize] = M {
                            start,
                            end,
                            stamp: clock,
                            inflight: busy,
                            live: true,
                            stale: false,
                        };
                        if busy == 1 {
                            pending.push(v.slot);
                        }
                    }
                }
                2 => {
                    let start = next(70) as usize * 4096 + next(4096) as usize;
                    let end = start + 1 + next(2 * 4096) as usize;
                    let mut want = 0;
                    for e in m.iter_mut() {
                        if e.live && e.start < end && e.end > start {
                            want += 1;
                            e.live = false;
                            e.stale = e.inflight > 0;
                            stale += e.stale as u32;
                        }
                    }
                    assert_eq!(t.invalidate(start, end), want);
                }
                _ => {
                    if !pending.is_empty() {
                        let slot = pending.swap_remove(next(pending.len() as u64) as usize);
                        t.done(slot);
                        let e = &mut m[slot as usize];
                        e.inflight -= 1;
                        if e.stale && e.inflight == 0 {
                            e.stale = false;
                        }
                    }
                }
            }
            assert_eq!(t.live(), m.iter().filter(|e| e.live).count());
        }
        assert!(hits > 100 && evictions > 100 && stale > 10 && full > 0,
            "the run covered too little: {hits} hits, {evictions} evictions, {stale} stale, {full} full");
    }
}
