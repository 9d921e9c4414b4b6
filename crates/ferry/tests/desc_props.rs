//! Property tests of the descriptor codec (`ferry::testing::{encode, decode}`): what a receiver
//! decodes is exactly what the sender encoded, and bytes from a faulty or hostile peer
//! never make `decode` panic or hand back a fragment outside a known lot.

use std::collections::HashMap;

use ferry::testing::{
    blocks_needed, decode, encode, RawDesc, RawFrag, RawRef, StrictLots, VecLots, BLOCK_BYTES,
    BLOCK_FRAGS, INLINE_FRAGS, MAX_FRAGS,
};
use proptest::prelude::*;

/// The lots fragments may point into: `(slot, generation)` keys that a receiver knows.
const KEYS: [(u16, u32); 3] = [(0, 1), (3, 2), (7, 9)];
/// Where the sender writes continuation blocks: a lot of its own.
const META: (u16, u32) = (1, 1);

/// Serialises a ring entry in the little-endian layout `RawDesc::from_bytes` parses.
fn desc_bytes(d: &RawDesc) -> [u8; 128] {
    d.to_bytes()
}

/// Lot sizes for the three keys.
fn lot_sizes() -> impl Strategy<Value = [u64; 3]> {
    let size = prop_oneof![Just(4096u64), Just(65536), Just(1 << 20)];
    [size.clone(), size.clone(), size]
}

/// A fragment as (lot index, offset seed, length seed), turned into a valid one by
/// [`place`] once the lot sizes are known.
fn frag_seeds(max: usize) -> impl Strategy<Value = Vec<(usize, u64, u64)>> {
    prop::collection::vec((0..KEYS.len(), any::<u64>(), any::<u64>()), 1..=max)
}

fn place(sizes: &[u64; 3], seeds: &[(usize, u64, u64)]) -> Vec<RawFrag> {
    seeds
        .iter()
        .map(|&(k, a, b)| {
            let size = sizes[k];
            let offset = a % size;
            // Mostly short fragments, now and then one that runs to the end of the lot.
            let room = size - offset;
            let len = if b % 8 == 0 {
                room
            } else {
                1 + (b >> 3) % room
            };
            RawFrag {
                slot: KEYS[k].0,
                pad: 0,
                generation: KEYS[k].1,
                offset,
                len,
            }
        })
        .collect()
}

/// Encodes `frags` with its blocks at `meta_off` in the [`META`] lot, and returns the
/// entry with lots holding the blocks. Also returns the blocks' span in the meta lot.
fn encode_into_lots(
    frags: &[RawFrag],
    sizes: &[u64; 3],
    meta_off: u64,
) -> (RawDesc, VecLots, std::ops::Range<usize>) {
    let nblocks = blocks_needed(frags.len());
    let mut blocks = vec![0u8; nblocks * BLOCK_BYTES];
    let at = RawRef {
        slot: META.0,
        pad: 0,
        generation: META.1,
        offset: meta_off,
    };
    let at = if nblocks == 0 { RawRef::NONE } else { at };
    let d = encode(0xfe11_0000 + frags.len() as u64, frags, &mut blocks, at);
    let mut lots = VecLots(HashMap::new());
    for (k, &size) in KEYS.iter().zip(sizes) {
        lots.0.insert(*k, vec![0xa5; size as usize]);
    }
    let start = meta_off as usize;
    let mut meta = vec![0x5a; start + blocks.len() + 64];
    meta[start..start + blocks.len()].copy_from_slice(&blocks);
    lots.0.insert(META, meta);
    (d, lots, start..start + blocks.len())
}

/// A fragment a random peer might send: mostly in lot (0,1) or (1,1) with a short
/// span, sometimes anything at all.
fn plausible_frag() -> impl Strategy<Value = RawFrag> {
    let small = 0u64..=(3 * BLOCK_BYTES as u64);
    (
        prop_oneof![19 => 0u16..=1, 1 => any::<u16>()],
        prop_oneof![19 => Just(1u32), 1 => any::<u32>()],
        prop_oneof![18 => 0u64..=512, 1 => small.clone(), 1 => any::<u64>()],
        prop_oneof![18 => 1u64..=64, 1 => small, 1 => any::<u64>()],
    )
        .prop_map(|(slot, generation, offset, len)| RawFrag {
            slot,
            pad: 0,
            generation,
            offset,
            len,
        })
}

/// A link a random peer might send: mostly to an aligned offset near the start of lot
/// (0,1) or (1,1), or none.
fn plausible_link() -> impl Strategy<Value = RawRef> {
    (
        prop_oneof![12 => 0u16..=1, 6 => Just(u16::MAX), 1 => any::<u16>()],
        prop_oneof![19 => Just(1u32), 1 => any::<u32>()],
        prop_oneof![
            18 => (0u64..8).prop_map(|o| o * 64),
            1 => (0u64..64).prop_map(|o| o * 8),
            1 => any::<u64>()
        ],
    )
        .prop_map(|(slot, generation, offset)| RawRef {
            slot,
            pad: 0,
            generation,
            offset,
        })
}

/// A continuation block a random peer might write: a header (count, link) followed by
/// up to two plausible fragments, usually as many as the count says.
fn plausible_block() -> impl Strategy<Value = Vec<u8>> {
    let honest = (1u32..=2, plausible_link()).prop_flat_map(|(count, link)| {
        (
            Just(count),
            Just(link),
            prop::collection::vec(plausible_frag(), count as usize),
        )
    });
    let odd = (
        prop_oneof![1u32..=BLOCK_FRAGS as u32, any::<u32>()],
        plausible_link(),
        prop::collection::vec(plausible_frag(), 0..=2),
    );
    prop_oneof![3 => honest, 1 => odd].prop_map(|(count, link, frags)| {
        let mut b = vec![0u8; 24 + 24 * frags.len()];
        b[0..4].copy_from_slice(&count.to_le_bytes());
        b[8..10].copy_from_slice(&link.slot.to_le_bytes());
        b[12..16].copy_from_slice(&link.generation.to_le_bytes());
        b[16..24].copy_from_slice(&link.offset.to_le_bytes());
        for (i, f) in frags.iter().enumerate() {
            let o = 24 + 24 * i;
            b[o..o + 2].copy_from_slice(&f.slot.to_le_bytes());
            b[o + 4..o + 8].copy_from_slice(&f.generation.to_le_bytes());
            b[o + 8..o + 16].copy_from_slice(&f.offset.to_le_bytes());
            b[o + 16..o + 24].copy_from_slice(&f.len.to_le_bytes());
        }
        b
    })
}

/// Random bytes of one lot, with some plausible blocks planted at 8-aligned offsets.
fn random_lot() -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![
            4 => prop::collection::vec(any::<u8>(), 1024..=3 * BLOCK_BYTES),
            1 => prop::collection::vec(any::<u8>(), 0..=3 * BLOCK_BYTES),
        ],
        prop::collection::vec((0usize..8, plausible_block()), 0..6),
    )
        .prop_map(|(mut bytes, blocks)| {
            for (slot, b) in blocks {
                let at = slot * 64;
                if at + b.len() <= bytes.len() {
                    bytes[at..at + b.len()].copy_from_slice(&b);
                }
            }
            bytes
        })
}

/// Random lot contents for lots (0,1) and (1,1).
fn random_lots() -> impl Strategy<Value = VecLots> {
    (random_lot(), random_lot()).prop_map(|(a, b)| {
        let mut l = VecLots(HashMap::new());
        l.0.insert((0, 1), a);
        l.0.insert((1, 1), b);
        // Lots no group can have: decode must refuse them whatever they hold.
        l.0.insert((64, 1), vec![0; 4096]);
        l.0.insert((u16::MAX - 1, 1), vec![0; 4096]);
        l
    })
}

/// A ring entry from a peer that may be anything: raw random bytes, or random fields
/// biased towards values that get past the first checks.
fn random_desc() -> impl Strategy<Value = [u8; 128]> {
    let raw = prop::collection::vec(any::<u8>(), 128).prop_map(|v| {
        let mut b = [0u8; 128];
        b.copy_from_slice(&v);
        b
    });
    // (nfrags, ninline): mostly a few fragments past the inline ones, so that decoding
    // follows links; sometimes anything.
    let counts = prop_oneof![
        18 => (0u32..=INLINE_FRAGS as u32, 0u32..=6).prop_map(|(i, extra)| (i + extra, i)),
        1 => (0u32..=(MAX_FRAGS as u32 + 1), 0u32..=INLINE_FRAGS as u32),
        1 => (any::<u32>(), any::<u32>()),
    ];
    let fields = (
        any::<u64>(),
        counts,
        prop::array::uniform3(plausible_frag()),
        plausible_link(),
    )
        .prop_map(|(token, (nfrags, ninline), inline, next)| {
            desc_bytes(&RawDesc {
                token,
                nfrags,
                ninline: ninline as u16,
                nfds: 0,
                inline,
                next,
                cargo: 0,
                reserved: 0,
            })
        });
    prop_oneof![1 => raw, 9 => fields]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(if cfg!(miri) { 4 } else { 256 }))]

    /// (1) Any valid fragment list, inline or chained through blocks in a lot, decodes to
    /// exactly what was encoded.
    #[test]
    fn encode_decode_round_trips(
        sizes in lot_sizes(),
        seeds in frag_seeds(1000),
        meta_slot in 0u64..512,
    ) {
        let frags = place(&sizes, &seeds);
        let (d, lots, _) = encode_into_lots(&frags, &sizes, meta_slot * 8);
        prop_assert_eq!(d.nfrags as usize, frags.len());
        prop_assert_eq!(d.ninline as usize, frags.len().min(INLINE_FRAGS));
        // The entry survives the trip through its byte form.
        prop_assert_eq!(RawDesc::from_bytes(&desc_bytes(&d)), d);
        let mut strict = StrictLots::new(lots);
        let got = decode(&d, &mut strict).expect("a valid descriptor decodes");
        strict.assert_sound(&d, &got);
        prop_assert_eq!(got, frags);
    }

    /// (3) One corrupted byte, in the ring entry or in a continuation block, gives either
    /// an error or in-bounds fragments.
    #[test]
    fn one_corrupt_byte_is_caught_or_harmless(
        sizes in lot_sizes(),
        seeds in frag_seeds(600),
        meta_slot in 0u64..64,
        at in any::<prop::sample::Index>(),
        xor in 1u8..=255,
    ) {
        let frags = place(&sizes, &seeds);
        let (d, mut lots, blocks) = encode_into_lots(&frags, &sizes, meta_slot * 8);
        let mut bytes = desc_bytes(&d);
        let i = at.index(bytes.len() + blocks.len());
        if i < bytes.len() {
            bytes[i] ^= xor;
        } else {
            lots.0.get_mut(&META).unwrap()[blocks.start + i - bytes.len()] ^= xor;
        }
        let d = RawDesc::from_bytes(&bytes);
        let mut strict = StrictLots::new(lots);
        if let Ok(got) = decode(&d, &mut strict) {
            strict.assert_sound(&d, &got);
        }
    }
}

proptest! {
    // Cheap cases, and most are refused early: run many.
    #![proptest_config(ProptestConfig::with_cases(if cfg!(miri) { 4 } else { 4096 }))]

    /// (2) Decoding arbitrary bytes never panics, and what it accepts lies inside known
    /// lots.
    #[test]
    fn decode_of_arbitrary_bytes_is_safe(bytes in random_desc(), lots in random_lots()) {
        let d = RawDesc::from_bytes(&bytes);
        let mut strict = StrictLots::new(lots);
        if let Ok(frags) = decode(&d, &mut strict) {
            strict.assert_sound(&d, &frags);
        }
    }
}

/// The chain a long message needs really is spread over several blocks, so the
/// properties above exercise links and not only the inline case.
#[test]
fn thousand_fragments_span_several_blocks() {
    assert_eq!(blocks_needed(INLINE_FRAGS), 0);
    assert_eq!(blocks_needed(INLINE_FRAGS + 1), 1);
    assert_eq!(
        blocks_needed(1000),
        (1000 - INLINE_FRAGS).div_ceil(BLOCK_FRAGS)
    );
    assert!(blocks_needed(1000) > 1);
}
