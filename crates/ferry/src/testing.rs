//! Hooks for ferry's own tests, fuzz targets, benchmarks and calibration (feature
//! `testing`, off by default). None of it is part of the supported API: it exposes the
//! channel's wire format and lets a caller break the rules the rest of the crate keeps
//! (push a descriptor no sender would write, find the control block's raw areas to
//! scribble on them as a hostile member would).
//!
//! - The descriptor wire format a ring entry carries ([`RawDesc`], [`RawFrag`],
//!   [`RawRef`]), its [`encode`]r and the receiver's validating [`decode`]r, with
//!   [`VecLots`] and [`StrictLots`], lots over plain byte vectors for property tests and
//!   the fuzz target.
//! - [`push_raw`]: a sender that writes any descriptor, for tests of how receivers treat
//!   a faulty or hostile peer.
//! - [`table_span`], [`bridge_note_at`] and [`activity_span`]: where the service table,
//!   a service's bridge note and a member's activity area lie in the control memfd.
//! - [`set_map_per_transfer`]: the fbuf paper's "uncached" receive, a benchmark baseline.

use crate::channel::desc::{check_span, Lots};
use crate::error::{BadDescriptor, Result};
use crate::{Receiver, Sender};

pub use crate::channel::desc::{
    blocks_needed, decode, encode, Lots as DescLots, RawDesc, RawFrag, RawRef, BLOCK_BYTES,
    BLOCK_FRAGS, INLINE_FRAGS, MAX_FRAGS,
};
/// The control block's layout limits, for tests that craft a hostile control block.
pub use crate::region::group::{LOT_WINDOWS, MAX_SLOTS};

/// Pushes a raw descriptor into `tx`'s ring, bypassing every check a send makes: for
/// tests of how receivers treat a faulty or hostile sender.
///
/// # Errors
/// [`Error::Full`](crate::Error::Full) when the ring is full; a corrupt ring's error.
pub fn push_raw(tx: &Sender, d: RawDesc) -> Result<()> {
    tx.push_raw(d)
}

/// Byte offset and length of the service table inside the control memfd, for tests that
/// play a hostile member.
pub fn table_span() -> (usize, usize) {
    crate::region::layout::service_area_span()
}

/// Byte offset (inside the control memfd) of the bridge note of live service `name`,
/// and the entry's version, for tests that forge notes as a hostile member would; the
/// note's words are: seq, role (1 imported, 2 carried), writer's member word, writer's
/// generation, entry version, length, then the text.
pub fn bridge_note_at(group: &crate::Group, name: &str) -> Option<(usize, u32)> {
    crate::service::note_at(group, name)
}

/// Byte offset and length of slot `slot`'s activity area inside the control memfd.
pub fn activity_span(slot: u16) -> (usize, usize) {
    crate::region::layout::activity_span(slot)
}

/// Maps every fragment `rx` receives afresh and unmaps it on release, instead of reading
/// through the cached mapping of the sender's lot. This is the "uncached" baseline of the
/// fbuf paper: it costs an `mmap`, page faults and an `munmap` per transfer, and
/// fragments then sit at a different address than in the sender.
pub fn set_map_per_transfer(rx: &mut Receiver, on: bool) {
    rx.set_map_per_transfer(on);
}

/// Lots backed by byte vectors, keyed by `(slot, generation)`: for tests and fuzzing.
#[derive(Debug, Default)]
pub struct VecLots(pub std::collections::HashMap<(u16, u32), Vec<u8>>);

impl Lots for VecLots {
    fn check(
        &mut self,
        slot: u16,
        generation: u32,
        offset: u64,
        len: u64,
    ) -> Result<(), BadDescriptor> {
        let lot = self
            .0
            .get(&(slot, generation))
            .ok_or(BadDescriptor::UnknownLot { slot, generation })?;
        check_span(lot.len() as u64, slot, offset, len)
    }

    fn read(&mut self, slot: u16, generation: u32, offset: u64, out: &mut [u8]) {
        let lot = &self.0[&(slot, generation)];
        out.copy_from_slice(&lot[offset as usize..offset as usize + out.len()]);
    }
}

/// [`VecLots`] that also enforces the contract [`decode`] promises its [`Lots`]: every
/// `read` covers a span a `check` accepted, so a bad descriptor cannot make a receiver
/// touch memory outside a lot. A violation panics. For the property tests and the fuzz
/// target.
#[derive(Debug, Default)]
pub struct StrictLots {
    /// The lots.
    pub lots: VecLots,
    checked: Vec<(u16, u32, u64, u64)>,
}

impl StrictLots {
    /// Wraps `lots`.
    pub fn new(lots: VecLots) -> Self {
        StrictLots {
            lots,
            checked: Vec::new(),
        }
    }

    /// Panics unless `frags`, as returned by a successful [`decode`] of `d`, are
    /// `d.nfrags` non-empty fragments inside known lots with a total length that does not
    /// overflow.
    pub fn assert_sound(&self, d: &RawDesc, frags: &[RawFrag]) {
        assert_eq!(frags.len() as u64, d.nfrags as u64);
        assert!(frags.len() as u64 <= MAX_FRAGS);
        let mut total = 0u64;
        for f in frags {
            assert!(f.len > 0, "empty fragment {f:?}");
            assert!((f.slot as usize) < MAX_SLOTS, "fragment in slot {}", f.slot);
            let lot = self
                .lots
                .0
                .get(&(f.slot, f.generation))
                .unwrap_or_else(|| panic!("fragment in unknown lot: {f:?}"));
            let end = f.offset.checked_add(f.len).expect("span overflows");
            assert!(
                end <= lot.len() as u64,
                "fragment {f:?} beyond lot of {}",
                lot.len()
            );
            total = total.checked_add(f.len).expect("total length overflows");
        }
    }
}

impl Lots for StrictLots {
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

static ADMIT_DELAY_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Makes every publisher of this process wait `delay` between making a new subscriber's
/// channel and listing it: for tests of what a subscriber sees in that window.
pub fn set_admit_delay(delay: std::time::Duration) {
    ADMIT_DELAY_MS.store(
        delay.as_millis() as u64,
        std::sync::atomic::Ordering::Relaxed,
    );
}

pub(crate) fn admit_delay() -> Option<std::time::Duration> {
    match ADMIT_DELAY_MS.load(std::sync::atomic::Ordering::Relaxed) {
        0 => None,
        ms => Some(std::time::Duration::from_millis(ms)),
    }
}
