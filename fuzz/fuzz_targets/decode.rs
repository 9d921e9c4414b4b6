//! Fuzzes `ferry::testing::decode`, the receiver's check of a ring entry and its
//! continuation blocks, which another process writes.
//!
//! Input layout: 128 bytes of ring entry, 2 bytes (little endian) giving how many of the
//! remaining bytes belong to lot (0,1), then the contents of lot (0,1) followed by those
//! of lot (1,1). `decode` must never panic, must read only spans it has checked, and
//! whatever it accepts must be `nfrags` non-empty fragments inside those two lots.
#![no_main]

use std::collections::HashMap;

use ferry::testing::{decode, RawDesc, StrictLots, VecLots};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((entry, rest)) = data.split_first_chunk::<128>() else {
        return;
    };
    let (split, rest) = match rest.split_first_chunk::<2>() {
        Some((s, r)) => (u16::from_le_bytes(*s) as usize, r),
        None => (0, rest),
    };
    let (a, b) = rest.split_at(split.min(rest.len()));
    let mut lots = VecLots(HashMap::new());
    lots.0.insert((0, 1), a.to_vec());
    lots.0.insert((1, 1), b.to_vec());
    // Slots no group can have (a group has MAX_SLOTS = 64): `assert_sound` fails if
    // decode ever accepts a fragment in one of them.
    lots.0.insert((64, 1), a.to_vec());
    lots.0.insert((100, 1), b.to_vec());
    let d = RawDesc::from_bytes(entry);
    let mut strict = StrictLots::new(lots);
    if let Ok(frags) = decode(&d, &mut strict) {
        strict.assert_sound(&d, &frags);
    }
});
