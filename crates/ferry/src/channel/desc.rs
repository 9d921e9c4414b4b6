//! The descriptors a channel carries: where each fragment of a message lies, never the
//! payload.
//!
//! ```text
//! ring entry (120 bytes, + 8-byte mark)        continuation block, in some lot (page)
//! +-------------------------------+           +----------------------------------+
//! | token u64 | nfrags u32 | ninl |           | count u32 | pad | next: RawRef   |
//! | u16 | nfds u16                |   next -> | RawFrag x count                  |
//! | inline: RawFrag x 3 (24 each) |           +----------------------------------+
//! | next: RawRef (slot,gen,off)   |
//! | cargo: u64 | reserved: u64    |   cargo -> i32 x nfds, in the sender's lot:
//! +-------------------------------+             its descriptor numbers (see `fds`)
//! ```
//! A message with up to three fragments fits in its ring entry; longer ones continue in a
//! chain of blocks the sender writes into its own lot. The receiver trusts none of it:
//! [`decode`] checks every lot, bound, count and link, and refuses cycles.

use std::collections::HashSet;

use crate::error::BadDescriptor;
use crate::region::group::MAX_SLOTS;

/// Fragments stored inline in a ring entry.
pub const INLINE_FRAGS: usize = 3;
/// Largest fragment count of one message.
pub const MAX_FRAGS: u64 = 4096;
pub use crate::sys::fds::MAX_FDS;
/// Size of one continuation block; blocks hold at most [`BLOCK_FRAGS`] fragments.
pub const BLOCK_BYTES: usize = 4096;
/// Fragments per continuation block.
pub const BLOCK_FRAGS: usize = (BLOCK_BYTES - BLOCK_HEADER) / FRAG_BYTES;
const BLOCK_HEADER: usize = 24;
const FRAG_BYTES: usize = 24;

/// One fragment: `len` bytes at `offset` in the lot of `(slot, generation)`.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct RawFrag {
    /// Slot of the lot's owner.
    pub slot: u16,
    /// Unused, zero.
    pub pad: u16,
    /// Generation of that slot.
    pub generation: u32,
    /// Byte offset in the lot.
    pub offset: u64,
    /// Length in bytes (non-zero).
    pub len: u64,
}

impl RawFrag {
    /// The fragment of `len` bytes at `offset` in the lot of `(slot, generation)`.
    pub const fn new(slot: u16, generation: u32, offset: u64, len: u64) -> RawFrag {
        RawFrag {
            slot,
            pad: 0,
            generation,
            offset,
            len,
        }
    }
}

/// A pointer to a continuation block; `slot == u16::MAX` means none.
#[repr(C)]
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct RawRef {
    /// Slot of the lot holding the block, or `u16::MAX` for none.
    pub slot: u16,
    /// Unused, zero.
    pub pad: u16,
    /// Generation of that slot.
    pub generation: u32,
    /// Byte offset of the block in the lot.
    pub offset: u64,
}

impl RawRef {
    /// The null link.
    pub const NONE: RawRef = RawRef {
        slot: u16::MAX,
        pad: 0,
        generation: 0,
        offset: 0,
    };
}

impl Default for RawRef {
    fn default() -> Self {
        Self::NONE
    }
}

/// A forward-ring entry.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct RawDesc {
    /// The sender's token for this message; the release carries it back.
    pub token: u64,
    /// Total fragments in the message.
    pub nfrags: u32,
    /// Fragments stored inline (the first ones).
    pub ninline: u16,
    /// Descriptors the message carries as cargo (at most [`MAX_FDS`]); their numbers in
    /// the sender's process are the `nfds` little-endian `i32` at [`cargo`](Self::cargo).
    pub nfds: u16,
    /// The inline fragments.
    pub inline: [RawFrag; INLINE_FRAGS],
    /// First continuation block.
    pub next: RawRef,
    /// Byte offset in the sender's own lot of the cargo's descriptor numbers (read only
    /// when `nfds` is non-zero).
    pub cargo: u64,
    /// Unused, zero: pads the entry to 120 bytes, so that with the ring's 8-byte
    /// publication mark a slot is exactly two cache lines, and a message of one fragment
    /// is written and read in the first line alone (`Entry::write_shared` /
    /// `read_shared` store and load only the fields in use).
    pub reserved: u64,
}

impl crate::channel::ring::Entry for RawDesc {
    unsafe fn read_shared(p: *const RawDesc) -> RawDesc {
        // Fields past the first cache line are read only when the entry uses them.
        // SAFETY: the caller guarantees `*p` is readable; each field is read on its own,
        // volatile, and any bit pattern is a valid value of it.
        unsafe {
            let mut d = RawDesc {
                token: std::ptr::addr_of!((*p).token).read_volatile(),
                nfrags: std::ptr::addr_of!((*p).nfrags).read_volatile(),
                ninline: std::ptr::addr_of!((*p).ninline).read_volatile(),
                nfds: std::ptr::addr_of!((*p).nfds).read_volatile(),
                ..RawDesc::default()
            };
            if d.nfds != 0 {
                d.cargo = std::ptr::addr_of!((*p).cargo).read_volatile();
            }
            let used = (d.ninline as usize).min(INLINE_FRAGS);
            for i in 0..used {
                d.inline[i] = std::ptr::addr_of!((*p).inline[i]).read_volatile();
            }
            if d.nfrags > d.ninline as u32 {
                d.next = std::ptr::addr_of!((*p).next).read_volatile();
            }
            d
        }
    }

    unsafe fn write_shared(p: *mut RawDesc, v: RawDesc) {
        // Only what `read_shared` reads: a message of one fragment then stores into the
        // slot's first cache line alone, and a send pays for one line's transfer from the
        // receiver's core instead of two.
        // SAFETY: the caller guarantees `*p` is writable and ours alone; each field is
        // written on its own, in place.
        unsafe {
            std::ptr::addr_of_mut!((*p).token).write_volatile(v.token);
            std::ptr::addr_of_mut!((*p).nfrags).write_volatile(v.nfrags);
            std::ptr::addr_of_mut!((*p).ninline).write_volatile(v.ninline);
            std::ptr::addr_of_mut!((*p).nfds).write_volatile(v.nfds);
            if v.nfds != 0 {
                std::ptr::addr_of_mut!((*p).cargo).write_volatile(v.cargo);
            }
            let used = (v.ninline as usize).min(INLINE_FRAGS);
            for i in 0..used {
                std::ptr::addr_of_mut!((*p).inline[i]).write_volatile(v.inline[i]);
            }
            if v.nfrags > v.ninline as u32 {
                std::ptr::addr_of_mut!((*p).next).write_volatile(v.next);
            }
        }
    }
}

/// Reads the lots a descriptor points into. Implemented over real mappings by the
/// channel, and over plain byte arrays by tests and the fuzz target.
pub trait Lots {
    /// Checks that `offset..offset+len` lies inside the lot `(slot, generation)`.
    fn check(
        &mut self,
        slot: u16,
        generation: u32,
        offset: u64,
        len: u64,
    ) -> Result<(), BadDescriptor>;
    /// Copies `out.len()` bytes at `offset` of the lot into `out`; called only after a
    /// successful [`check`](Self::check) of that span.
    fn read(&mut self, slot: u16, generation: u32, offset: u64, out: &mut [u8]);
}

fn le_u16(b: &[u8]) -> u16 {
    u16::from_le_bytes([b[0], b[1]])
}
fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b[..4].try_into().expect("4 bytes"))
}
fn le_u64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
}

/// A fragment's wire form is a [`RawRef`]'s (slot, pad, generation, offset) followed by
/// its length.
impl RawFrag {
    fn parse(b: &[u8]) -> RawFrag {
        let RawRef {
            slot,
            pad,
            generation,
            offset,
        } = RawRef::parse(b);
        RawFrag {
            slot,
            pad,
            generation,
            offset,
            len: le_u64(&b[16..]),
        }
    }
    fn write(&self, b: &mut [u8]) {
        RawRef {
            slot: self.slot,
            pad: 0,
            generation: self.generation,
            offset: self.offset,
        }
        .write(b);
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
    }
}

impl RawRef {
    fn parse(b: &[u8]) -> RawRef {
        RawRef {
            slot: le_u16(b),
            pad: le_u16(&b[2..]),
            generation: le_u32(&b[4..]),
            offset: le_u64(&b[8..]),
        }
    }
    fn write(&self, b: &mut [u8]) {
        b[0..2].copy_from_slice(&self.slot.to_le_bytes());
        b[2..4].copy_from_slice(&0u16.to_le_bytes());
        b[4..8].copy_from_slice(&self.generation.to_le_bytes());
        b[8..16].copy_from_slice(&self.offset.to_le_bytes());
    }
}

/// Validates a descriptor and returns its fragments, in order.
///
/// Checks: fragment count within [`MAX_FRAGS`] and matching what the blocks hold; every
/// fragment non-empty and inside a known lot; the total length not overflowing; every
/// block inside a known lot, 8-byte aligned, visited at most once (no cycles).
#[cfg(any(test, feature = "testing"))]
pub fn decode(d: &RawDesc, lots: &mut impl Lots) -> Result<Vec<RawFrag>, BadDescriptor> {
    let mut out = Vec::new();
    decode_into(d, lots, &mut out)?;
    Ok(out)
}

/// Like [`decode`], writing the fragments into `out` (cleared first), so that a
/// receiver can reuse one buffer for every message.
pub fn decode_into(
    d: &RawDesc,
    lots: &mut impl Lots,
    out: &mut Vec<RawFrag>,
) -> Result<(), BadDescriptor> {
    out.clear();
    let n = d.nfrags as u64;
    if n > MAX_FRAGS {
        return Err(BadDescriptor::TooManyFragments(n));
    }
    if d.ninline as usize > INLINE_FRAGS || d.ninline as u64 > n {
        return Err(BadDescriptor::Malformed("inline count"));
    }
    out.reserve(n as usize);
    let mut total: u64 = 0;
    let mut push =
        |f: RawFrag,
         out: &mut Vec<RawFrag>,
         lots: &mut dyn FnMut(&RawFrag) -> Result<(), BadDescriptor>| {
            if f.len == 0 {
                return Err(BadDescriptor::BadLength);
            }
            total = total.checked_add(f.len).ok_or(BadDescriptor::BadLength)?;
            lots(&f)?;
            out.push(f);
            Ok(())
        };
    for f in &d.inline[..d.ninline as usize] {
        push(*f, out, &mut |f| {
            check_in(lots, f.slot, f.generation, f.offset, f.len)
        })?;
    }
    let mut next = d.next;
    // Made on first use, like `block`: hashing state costs even when nothing is hashed.
    let mut seen: Option<HashSet<(u16, u32, u64)>> = None;
    // Allocated on first use: most messages have no continuation block.
    let mut block = Vec::new();
    while (out.len() as u64) < n {
        if next.slot == u16::MAX {
            return Err(BadDescriptor::CountMismatch {
                expected: n,
                found: out.len() as u64,
            });
        }
        if !seen
            .get_or_insert_with(HashSet::new)
            .insert((next.slot, next.generation, next.offset))
        {
            return Err(BadDescriptor::Cycle);
        }
        if block.is_empty() {
            block = vec![0u8; BLOCK_BYTES];
        }
        if next.offset % 8 != 0 {
            return Err(BadDescriptor::Malformed("unaligned block"));
        }
        check_in(
            lots,
            next.slot,
            next.generation,
            next.offset,
            BLOCK_HEADER as u64,
        )?;
        lots.read(
            next.slot,
            next.generation,
            next.offset,
            &mut block[..BLOCK_HEADER],
        );
        let count = le_u32(&block) as usize;
        if count == 0 || count > BLOCK_FRAGS {
            return Err(BadDescriptor::Malformed("block count"));
        }
        let bytes = BLOCK_HEADER + count * FRAG_BYTES;
        check_in(lots, next.slot, next.generation, next.offset, bytes as u64)?;
        lots.read(next.slot, next.generation, next.offset, &mut block[..bytes]);
        // Re-read the header from the same copy: the sender may change the block under us.
        if le_u32(&block) as usize != count {
            return Err(BadDescriptor::Malformed("block changed while read"));
        }
        let link = RawRef::parse(&block[8..24]);
        for i in 0..count {
            if out.len() as u64 >= n {
                return Err(BadDescriptor::CountMismatch {
                    expected: n,
                    found: n + (count - i) as u64,
                });
            }
            let at = BLOCK_HEADER + i * FRAG_BYTES;
            let f = RawFrag::parse(&block[at..at + FRAG_BYTES]);
            push(f, out, &mut |f| {
                check_in(lots, f.slot, f.generation, f.offset, f.len)
            })?;
        }
        next = link;
    }
    if next.slot != u16::MAX {
        return Err(BadDescriptor::CountMismatch {
            expected: n,
            found: n + 1,
        });
    }
    Ok(())
}

/// Refuses a slot no group can have before asking `lots`: a descriptor is written by
/// another process, and no lookup may index a slot table with its number unchecked.
fn check_in(
    lots: &mut impl Lots,
    slot: u16,
    generation: u32,
    offset: u64,
    len: u64,
) -> Result<(), BadDescriptor> {
    if slot as usize >= MAX_SLOTS {
        return Err(BadDescriptor::UnknownLot { slot, generation });
    }
    lots.check(slot, generation, offset, len)
}

/// How many continuation blocks a message of `n` fragments needs.
pub fn blocks_needed(n: usize) -> usize {
    n.saturating_sub(INLINE_FRAGS).div_ceil(BLOCK_FRAGS)
}

/// Encodes `frags` into a ring entry, writing any continuation blocks into `blocks`,
/// which must be `blocks_needed(frags.len()) * BLOCK_BYTES` bytes located at `at` (the
/// lot and offset the receiver will resolve).
pub fn encode(token: u64, frags: &[RawFrag], blocks: &mut [u8], at: RawRef) -> RawDesc {
    assert!(frags.len() as u64 <= MAX_FRAGS);
    let nblocks = blocks_needed(frags.len());
    assert_eq!(blocks.len(), nblocks * BLOCK_BYTES);
    let ninline = frags.len().min(INLINE_FRAGS);
    let mut d = RawDesc {
        token,
        nfrags: frags.len() as u32,
        ninline: ninline as u16,
        ..Default::default()
    };
    d.inline[..ninline].copy_from_slice(&frags[..ninline]);
    let rest = &frags[ninline..];
    for (i, chunk) in rest.chunks(BLOCK_FRAGS).enumerate() {
        let b = &mut blocks[i * BLOCK_BYTES..(i + 1) * BLOCK_BYTES];
        b[0..4].copy_from_slice(&(chunk.len() as u32).to_le_bytes());
        b[4..8].fill(0);
        let link = if i + 1 < nblocks {
            RawRef {
                offset: at.offset + ((i + 1) * BLOCK_BYTES) as u64,
                ..at
            }
        } else {
            RawRef::NONE
        };
        link.write(&mut b[8..24]);
        for (j, f) in chunk.iter().enumerate() {
            let o = BLOCK_HEADER + j * FRAG_BYTES;
            f.write(&mut b[o..o + FRAG_BYTES]);
        }
    }
    if nblocks > 0 {
        d.next = at;
    }
    d
}

/// Checks that `offset..offset+len` lies inside a lot of `lot_len` bytes.
pub fn check_span(lot_len: u64, slot: u16, offset: u64, len: u64) -> Result<(), BadDescriptor> {
    match offset.checked_add(len) {
        Some(end) if end <= lot_len => Ok(()),
        _ => Err(BadDescriptor::OutOfBounds { slot, offset, len }),
    }
}

#[cfg(any(test, feature = "testing"))]
impl RawDesc {
    /// The entry's 128-byte little-endian form, the inverse of [`from_bytes`](Self::from_bytes)
    /// (the reserved word is not kept).
    pub fn to_bytes(&self) -> [u8; 128] {
        let mut b = [0u8; 128];
        b[0..8].copy_from_slice(&self.token.to_le_bytes());
        b[8..12].copy_from_slice(&self.nfrags.to_le_bytes());
        b[12..14].copy_from_slice(&self.ninline.to_le_bytes());
        b[14..16].copy_from_slice(&self.nfds.to_le_bytes());
        for (i, f) in self.inline.iter().enumerate() {
            f.write(&mut b[16 + i * FRAG_BYTES..16 + (i + 1) * FRAG_BYTES]);
        }
        self.next.write(&mut b[88..104]);
        b[104..112].copy_from_slice(&self.cargo.to_le_bytes());
        b
    }

    /// Parses an entry from its 128-byte little-endian form (used by the fuzz target).
    pub fn from_bytes(b: &[u8; 128]) -> RawDesc {
        let mut d = RawDesc {
            token: le_u64(b),
            nfrags: le_u32(&b[8..]),
            ninline: le_u16(&b[12..]),
            nfds: le_u16(&b[14..]),
            cargo: le_u64(&b[104..]),
            ..Default::default()
        };
        for i in 0..INLINE_FRAGS {
            d.inline[i] = RawFrag::parse(&b[16 + i * FRAG_BYTES..]);
        }
        d.next = RawRef::parse(&b[88..]);
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frag(slot: u16, offset: u64, len: u64) -> RawFrag {
        RawFrag {
            slot,
            pad: 0,
            generation: 1,
            offset,
            len,
        }
    }

    use crate::testing::VecLots;

    fn lots() -> VecLots {
        let mut l = VecLots::default();
        l.0.insert((0, 1), vec![0; 1 << 16]);
        l.0.insert((1, 1), vec![0; 1 << 16]);
        l
    }

    #[test]
    fn layout() {
        assert_eq!(std::mem::size_of::<RawFrag>(), FRAG_BYTES);
        assert_eq!(std::mem::size_of::<RawRef>(), 16);
        assert_eq!(std::mem::size_of::<RawDesc>(), 120);
        assert_eq!(std::mem::offset_of!(RawDesc, next), 88);
        assert_eq!(std::mem::offset_of!(RawDesc, nfds), 14);
        assert_eq!(std::mem::offset_of!(RawDesc, cargo), 104);
        // In a ring slot (after the 8-byte mark) the first fragment ends inside the first
        // cache line.
        assert!(8 + std::mem::offset_of!(RawDesc, inline) + FRAG_BYTES <= 64);
        const { assert!(BLOCK_FRAGS == 169) };
    }

    #[test]
    fn inline_round_trip() {
        let fr = vec![frag(0, 0, 10), frag(1, 4096, 5)];
        let d = encode(7, &fr, &mut [], RawRef::NONE);
        assert_eq!(decode(&d, &mut lots()).unwrap(), fr);
    }

    #[test]
    fn chained_round_trip() {
        let n = if cfg!(miri) { 200 } else { 1000 };
        let fr: Vec<_> = (0..n).map(|i| frag((i % 2) as u16, i * 8, 8)).collect();
        let nb = blocks_needed(fr.len());
        let mut blocks = vec![0u8; nb * BLOCK_BYTES];
        let at = RawRef {
            slot: 1,
            pad: 0,
            generation: 1,
            offset: 8192,
        };
        let d = encode(1, &fr, &mut blocks, at);
        let mut l = lots();
        l.0.get_mut(&(1, 1)).unwrap()[8192..8192 + blocks.len()].copy_from_slice(&blocks);
        assert_eq!(decode(&d, &mut l).unwrap(), fr);
    }

    #[test]
    fn rejects_bad_descriptors() {
        let mut l = lots();
        let bad = |fr: Vec<RawFrag>| encode(0, &fr, &mut [], RawRef::NONE);
        assert!(matches!(
            decode(&bad(vec![frag(5, 0, 1)]), &mut l),
            Err(BadDescriptor::UnknownLot { .. })
        ));
        assert!(matches!(
            decode(&bad(vec![frag(0, 65535, 2)]), &mut l),
            Err(BadDescriptor::OutOfBounds { .. })
        ));
        assert!(matches!(
            decode(&bad(vec![frag(0, u64::MAX, 2)]), &mut l),
            Err(BadDescriptor::OutOfBounds { .. })
        ));
        assert!(matches!(
            decode(&bad(vec![frag(0, 0, 0)]), &mut l),
            Err(BadDescriptor::BadLength)
        ));
        let mut d = bad(vec![frag(0, 0, 1)]);
        d.nfrags = 5000;
        assert!(matches!(
            decode(&d, &mut l),
            Err(BadDescriptor::TooManyFragments(5000))
        ));
        d.nfrags = 3;
        assert!(matches!(
            decode(&d, &mut l),
            Err(BadDescriptor::CountMismatch { .. })
        ));
        d.nfrags = 1;
        d.ninline = 9;
        assert!(matches!(
            decode(&d, &mut l),
            Err(BadDescriptor::Malformed(_))
        ));
    }

    #[test]
    fn rejects_cycles() {
        // A block whose link points to itself.
        let mut l = lots();
        let at = RawRef {
            slot: 0,
            pad: 0,
            generation: 1,
            offset: 0,
        };
        let fr: Vec<_> = (0..6).map(|i| frag(0, 4096 + i, 1)).collect();
        let mut blocks = vec![0u8; BLOCK_BYTES];
        let mut d = encode(0, &fr, &mut blocks, at);
        at.write(&mut blocks[8..24]);
        l.0.get_mut(&(0, 1)).unwrap()[..BLOCK_BYTES].copy_from_slice(&blocks);
        d.nfrags = 100;
        assert_eq!(decode(&d, &mut l), Err(BadDescriptor::Cycle));
    }
}
