//! Fuzzes `ferry::channel::desc::decode`, the receiver's check of a ring entry and its
//! continuation blocks, which another process writes.
//!
//! Input layout: 128 bytes of ring entry, 2 bytes (little endian) giving how many of the
//! remaining bytes belong to lot (0,1), then the contents of lot (0,1) followed by those
//! of lot (1,1). `decode` must never panic, must read only spans it has checked, and
//! whatever it accepts must be `nfrags` non-empty fragments inside those two lots.
#![no_main]

use std::collections::HashMap;

use ferry::channel::desc::{decode, Lots, RawDesc, VecLots};
use ferry::BadDescriptor;
use libfuzzer_sys::fuzz_target;

/// [`VecLots`], checking that every read lies inside a span a check accepted.
struct Strict {
    lots: VecLots,
    checked: Vec<(u16, u32, u64, u64)>,
}

impl Lots for Strict {
    fn check(
        &mut self,
        slot: u16,
        generation: u32,
        offset: u64,
        len: u64,
    ) -> Result<(), BadDescriptor> {
        self.lots.check(slot, generation, offset, len)?;
        self.checked.push((slot, generation, offset, len));
        Ok(())
    }

    fn read(&mut self, slot: u16, generation: u32, offset: u64, out: &mut [u8]) {
        let len = out.len() as u64;
        assert!(
            self.checked
                .iter()
                .any(|&(s, g, o, l)| (s, g) == (slot, generation)
                    && o <= offset
                    && offset + len <= o + l),
            "read of {len} bytes at {offset} in lot {slot}.{generation} that no check accepted"
        );
        self.lots.read(slot, generation, offset, out);
    }
}

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
    let d = RawDesc::from_bytes(entry);
    let mut strict = Strict {
        lots,
        checked: Vec::new(),
    };
    if let Ok(frags) = decode(&d, &mut strict) {
        assert_eq!(frags.len() as u64, d.nfrags as u64);
        let mut total = 0u64;
        for f in &frags {
            assert!(f.len > 0, "empty fragment {f:?}");
            let lot = strict
                .lots
                .0
                .get(&(f.slot, f.generation))
                .expect("fragment in a known lot");
            let end = f.offset.checked_add(f.len).expect("span does not overflow");
            assert!(
                end <= lot.len() as u64,
                "fragment {f:?} beyond its lot of {}",
                lot.len()
            );
            total = total
                .checked_add(f.len)
                .expect("total length does not overflow");
        }
    }
});
