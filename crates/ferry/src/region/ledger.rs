//! The reference ledger: which spans of other domains' lots each domain holds because
//! someone other than their owner handed them over, so that memory is reclaimed after a
//! death only when no live domain still holds it.
//!
//! The owner of an fbuf learns of ordinary releases through its channels: every message it
//! sends comes back as one release. A forwarded fragment is different. When a stage
//! forwards a span of its source's lot to a sink, the source sees only the stage holding
//! it; if the stage dies, the channel tells the source to take back everything the stage
//! held, although the sink may still be reading some of it. The same holds one level down:
//! a stage that sees its sink die would drop its references to the source's spans, which
//! releases them upstream, although the sink may have forwarded them further.
//!
//! So a domain that sees a peer die does not drop what that peer held. It *quarantines*
//! it (see [`DomainInner::settle`](super::domain::DomainInner)) and lets each piece go only
//! when the ledger shows no live domain holding it:
//!
//! * Every domain has a ledger in the group's control block (one per slot, cleared when
//!   the slot is claimed). Only its owner writes it; anyone reads it.
//! * `holds`: a receiver records each fragment it receives whose lot does not belong to
//!   the channel's sender (a forwarded fragment), as `(lot, offset, len)`, before the
//!   message is handed to the application, and clears the entry when the message is
//!   released. A full ledger makes the receiver copy the fragment instead (counted).
//! * `inbound`: a receiver records each channel it accepts, by sender, before the sender
//!   may send, and clears the entry once it knows the sender can send no more and it has
//!   taken every message from the ring (the sender died or closed, and the ring is
//!   empty), or when the receiver is dropped. While a live domain still has an entry for a
//!   dead sender, that sender's last messages may still be on their way into a ledger, so
//!   nothing is released from quarantine.
//!
//! Why this is enough: a forwarder holds what it forwarded until the next domain releases
//! it, and that domain records its hold before it can forward it again and clears it only
//! when it releases, so along a chain of live domains every span is covered by some entry
//! until the last one lets go. A descriptor still in a ring whose sender died is covered
//! by the receiver's `inbound` entry. Entries of dead domains are ignored: a dead domain
//! reads nothing.
//!
//! What this does not protect against: a member of the group runs as the same user, and
//! can write any ledger; a false entry only keeps memory in quarantine longer (the owner's
//! quota stays charged), a cleared one can make memory be reused under a reader that is
//! that member itself or downstream of it.

use std::sync::atomic::Ordering;

use super::layout::{LedgerRaw, HOLDS, INBOUND};
use crate::segment::LotId;

fn pack_domain(lot: LotId) -> u64 {
    (lot.generation as u64) << 16 | lot.slot as u64 | 1 << 63
}

fn unpack_domain(v: u64) -> LotId {
    LotId {
        slot: (v & 0xffff) as u16,
        generation: (v >> 16) as u32,
    }
}

/// `key` of a hold: bit 0 set, slot in bits 1..8, generation in 8..40, version above.
fn pack_key(lot: LotId, version: u32) -> u64 {
    1 | (lot.slot as u64 & 0x7f) << 1 | (lot.generation as u64) << 8 | (version as u64) << 40
}

fn key_lot(key: u64) -> LotId {
    LotId {
        slot: ((key >> 1) & 0x7f) as u16,
        generation: (key >> 8) as u32,
    }
}

/// A span some live domain holds, as read from its ledger.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Held {
    /// `len` bytes at `offset` of `lot`.
    Span { lot: LotId, offset: u64, len: u64 },
    /// An entry changed while it was read: treat every span of `lot` as held.
    Lot(LotId),
}

impl Held {
    /// True if this hold covers any byte of `offset..offset+len` in `lot`.
    pub fn overlaps(&self, lot: LotId, offset: u64, len: u64) -> bool {
        match *self {
            Held::Lot(l) => l == lot,
            Held::Span {
                lot: l,
                offset: o,
                len: n,
            } => l == lot && o < offset.saturating_add(len) && offset < o.saturating_add(n),
        }
    }
}

impl LedgerRaw {
    /// Forgets everything a previous owner of the slot recorded. Called by the new owner
    /// while the slot is still being claimed, before anyone reads it as live.
    pub fn clear(&self) {
        for e in &self.inbound {
            e.store(0, Ordering::Relaxed);
        }
        let high = (self.high.load(Ordering::Relaxed) as usize).min(HOLDS);
        for h in &self.holds[..high] {
            // SYNC: Release: a reader of a dead domain's ledger that sees an entry cleared
            // here then sees the slot's new generation (bumped before this) and knows it
            // read a ledger that is no longer the dead domain's.
            h.key.store(0, Ordering::Release);
        }
        // SYNC: publishing the slot (a Release store of its state) orders these.
        self.high.store(0, Ordering::Relaxed);
    }

    /// Called by a process claiming the slot, before it bumps the generation from `old`:
    /// records whether the previous owner held anything.
    pub fn note_previous(&self, old: u32) {
        let mut held = Vec::new();
        self.holds(&mut held);
        let v = if held.is_empty() {
            old
        } else {
            old.wrapping_add(1)
        };
        // SYNC: Release, and the generation bump that follows is AcqRel: a reader that
        // sees the new generation sees this.
        self.clean.store(v, Ordering::Release);
    }

    /// True if the domain of generation `generation` that owned this slot before it was
    /// claimed again held nothing when it went.
    pub fn was_clean(&self, generation: u32) -> bool {
        self.clean.load(Ordering::Acquire) == generation
    }

    /// Senders this domain has open channels from, as recorded.
    pub fn inbound(&self) -> impl Iterator<Item = LotId> + '_ {
        self.inbound.iter().filter_map(|e| {
            // SYNC: pairs with the Release store that clears an entry after the
            // receiver recorded the holds of the last messages it took.
            let v = e.load(Ordering::Acquire);
            (v != 0).then(|| unpack_domain(v))
        })
    }

    /// Every hold recorded, read once (call after [`inbound`](Self::inbound)).
    pub fn holds(&self, out: &mut Vec<Held>) {
        let high = (self.high.load(Ordering::Acquire) as usize).min(HOLDS);
        for h in &self.holds[..high] {
            // SYNC: pairs with the Release store of `key` in `Ledger::hold`.
            let k1 = h.key.load(Ordering::Acquire);
            if k1 == 0 {
                continue;
            }
            let offset = h.offset.load(Ordering::Relaxed);
            let len = h.len.load(Ordering::Relaxed);
            std::sync::atomic::fence(Ordering::Acquire);
            let k2 = h.key.load(Ordering::Relaxed);
            out.push(if k1 == k2 {
                Held::Span {
                    lot: key_lot(k1),
                    offset,
                    len,
                }
            } else {
                Held::Lot(key_lot(k1))
            });
        }
    }
}

/// This process's writer for its domain's ledger: which entries are free.
#[derive(Debug)]
pub(crate) struct Ledger {
    free_holds: Vec<u32>,
    next_hold: u32,
    version: u32,
    free_inbound: Vec<u32>,
}

impl Ledger {
    pub fn new() -> Self {
        Ledger {
            free_holds: Vec::new(),
            next_hold: 0,
            version: 0,
            free_inbound: (0..INBOUND as u32).rev().collect(),
        }
    }

    /// Records that this domain holds `len` bytes at `offset` of `lot`. `None` if the
    /// ledger is full.
    pub fn hold(&mut self, raw: &LedgerRaw, lot: LotId, offset: u64, len: u64) -> Option<u32> {
        let i = match self.free_holds.pop() {
            Some(i) => i,
            None if (self.next_hold as usize) < HOLDS => {
                self.next_hold += 1;
                raw.high.store(self.next_hold, Ordering::Release);
                self.next_hold - 1
            }
            None => return None,
        };
        self.version = self.version.wrapping_add(1) & 0x00ff_ffff;
        let h = &raw.holds[i as usize];
        h.offset.store(offset, Ordering::Relaxed);
        h.len.store(len, Ordering::Relaxed);
        // SYNC: pairs with the Acquire load of `key` by readers (`LedgerRaw::holds`).
        h.key.store(pack_key(lot, self.version), Ordering::Release);
        Some(i)
    }

    /// Clears a hold recorded by [`hold`](Self::hold).
    pub fn unhold(&mut self, raw: &LedgerRaw, i: u32) {
        raw.holds[i as usize].key.store(0, Ordering::Release);
        self.free_holds.push(i);
    }

    /// Records a channel from `sender`; `None` if this domain has too many.
    pub fn add_inbound(&mut self, raw: &LedgerRaw, sender: LotId) -> Option<u32> {
        let i = self.free_inbound.pop()?;
        // SYNC: the receiver publishes readiness to the sender with a Release store after
        // this, so the entry is visible before the sender can send anything.
        raw.inbound[i as usize].store(pack_domain(sender), Ordering::Release);
        Some(i)
    }

    /// Clears a channel entry: its sender can send no more and its ring is empty.
    pub fn remove_inbound(&mut self, raw: &LedgerRaw, i: u32) {
        // SYNC: Release: the holds recorded for the channel's last messages are visible to
        // anyone who sees the entry gone.
        raw.inbound[i as usize].store(0, Ordering::Release);
        self.free_inbound.push(i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw() -> Box<LedgerRaw> {
        let layout = std::alloc::Layout::new::<LedgerRaw>();
        // SAFETY: the layout is LedgerRaw's (not zero-sized); LedgerRaw is plain atomics,
        // for which all-zero bytes are a valid value (the state of a fresh control block),
        // and the allocation came from the global allocator with that layout, as
        // Box::from_raw requires.
        unsafe {
            let p = std::alloc::alloc_zeroed(layout).cast::<LedgerRaw>();
            assert!(!p.is_null());
            Box::from_raw(p)
        }
    }

    #[test]
    fn holds_are_recorded_and_cleared() {
        let r = raw();
        let mut l = Ledger::new();
        let lot = LotId {
            slot: 63,
            generation: u32::MAX,
        };
        let a = l.hold(&r, lot, 4096, 100).unwrap();
        let b = l.hold(&r, lot, 0, 1).unwrap();
        let mut out = Vec::new();
        r.holds(&mut out);
        assert_eq!(
            out,
            vec![
                Held::Span {
                    lot,
                    offset: 4096,
                    len: 100
                },
                Held::Span {
                    lot,
                    offset: 0,
                    len: 1
                }
            ]
        );
        assert!(out[0].overlaps(lot, 4195, 10));
        assert!(!out[0].overlaps(lot, 4196, 10));
        assert!(!out[0].overlaps(LotId { slot: 62, ..lot }, 4096, 10));
        l.unhold(&r, a);
        l.unhold(&r, b);
        out.clear();
        r.holds(&mut out);
        assert!(out.is_empty());
        // Reuse does not grow the scanned range.
        l.hold(&r, lot, 1, 1).unwrap();
        assert_eq!(r.high.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_full_ledger_refuses_and_clear_forgets() {
        let r = raw();
        let mut l = Ledger::new();
        let lot = LotId {
            slot: 1,
            generation: 2,
        };
        for _ in 0..HOLDS {
            l.hold(&r, lot, 0, 1).unwrap();
        }
        assert!(l.hold(&r, lot, 0, 1).is_none());
        let i = l.add_inbound(&r, lot).unwrap();
        assert_eq!(r.inbound().collect::<Vec<_>>(), vec![lot]);
        l.remove_inbound(&r, i);
        assert_eq!(r.inbound().count(), 0);
        l.add_inbound(&r, lot).unwrap();
        r.clear();
        let mut out = Vec::new();
        r.holds(&mut out);
        assert!(out.is_empty());
        assert_eq!(r.inbound().count(), 0);
    }
}
