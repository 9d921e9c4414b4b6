//! How each process of a chain touches a message: the originator writes one
//! word per page, a stage reads one word per page, and the final receiver
//! reads one word per page or every byte.
//!
//! Each function takes a fragment and its offset in the message, so the same
//! code serves a contiguous copy buffer and a list of shared-memory fragments.

use std::hint::black_box;

use crate::protocol::Touch;

/// The page size the papers count in.
pub const PAGE: usize = 4096;

/// Offsets inside `frag` where a page of the message begins, given that
/// `frag` starts `offset` bytes into the message.
fn page_starts(offset: usize, frag_len: usize) -> impl Iterator<Item = usize> {
    let first = (PAGE - offset % PAGE) % PAGE;
    (first..frag_len.saturating_sub(7)).step_by(PAGE)
}

/// Writes `value` as one word at the start of every page in `frag`.
pub fn write_words(offset: usize, frag: &mut [u8], value: u64) {
    let bytes = value.to_ne_bytes();
    for i in page_starts(offset, frag.len()) {
        frag[i..i + 8].copy_from_slice(&bytes);
    }
}

/// Reads the word at the start of every page in `frag`.
pub fn read_words(offset: usize, frag: &[u8]) -> u64 {
    let mut acc = 0u64;
    for i in page_starts(offset, frag.len()) {
        acc = acc.wrapping_add(u64::from_ne_bytes(
            frag[i..i + 8].try_into().expect("8 bytes"),
        ));
    }
    black_box(acc)
}

/// Reads every byte of `frag`, eight at a time.
pub fn read_all(frag: &[u8]) -> u64 {
    let mut chunks = frag.chunks_exact(8);
    let mut acc = 0u64;
    for c in &mut chunks {
        acc = acc.wrapping_add(u64::from_ne_bytes(c.try_into().expect("8 bytes")));
    }
    for &b in chunks.remainder() {
        acc = acc.wrapping_add(u64::from(b));
    }
    black_box(acc)
}

/// Reads `frag` the way `touch` says.
pub fn read(touch: Touch, offset: usize, frag: &[u8]) -> u64 {
    match touch {
        Touch::Word => read_words(offset, frag),
        Touch::All => read_all(frag),
        Touch::Header | Touch::HeaderAfterWrites => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_word_per_page_even_when_fragments_are_unaligned() {
        let mut msg = vec![0u8; 3 * PAGE];
        let (a, b) = msg.split_at_mut(PAGE + 100);
        write_words(0, a, 1);
        write_words(PAGE + 100, b, 1);
        assert_eq!(read_words(0, &msg), 3);
        let (a, b) = msg.split_at(PAGE + 100);
        assert_eq!(read_words(0, a) + read_words(PAGE + 100, b), 3);
    }

    #[test]
    fn read_all_sums_every_byte() {
        let msg = vec![1u8; 8 * 3 + 5];
        assert_eq!(read_all(&msg), 3 * 0x0101_0101_0101_0101 + 5);
    }
}
