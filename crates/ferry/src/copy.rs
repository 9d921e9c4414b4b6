//! Byte copies that avoid a slow case of the C library's `memcpy` on some x86 CPUs.
//!
//! When the destination lies 1 to 31 bytes past the source modulo 4 KiB, glibc's
//! `memcpy` (its `rep movsb` path, from a few KiB up to the size where it switches to
//! non-temporal stores) ran more than ten times slower where measured: each store aliases the
//! next loads on their low 12 address bits. That is the common case of copying out of a
//! page-aligned fbuf into a heap buffer of 128 KiB or more, which the allocator maps on
//! its own and hands out 16 bytes past a page boundary; offsets 0 and 32 to 4095 are
//! fast. Copying the same bytes in 256-byte blocks from the end backwards never loads
//! what it just stored on the same low bits, and costs about what an unskewed `memcpy`
//! does (the measurements: docs/semantics.md, "A slow case of glibc's `memcpy`").

/// Below this a copy is too short for the slow path to matter.
const SLOW_FROM: usize = 2048;
/// The block the backward copy moves at a time.
const BLOCK: usize = 256;

/// Copies `src` into `dst` (equal lengths), as `copy_from_slice`, but backwards in blocks
/// when the two would alias (see the module docs).
pub(crate) fn copy_bytes(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_bytes: lengths differ");
    let n = src.len();
    let skew = (dst.as_ptr() as usize).wrapping_sub(src.as_ptr() as usize) % 4096;
    if n < SLOW_FROM || !(1..32).contains(&skew) {
        dst.copy_from_slice(src);
        return;
    }
    let mut at = n - n % BLOCK;
    dst[at..].copy_from_slice(&src[at..]);
    while at > 0 {
        at -= BLOCK;
        dst[at..at + BLOCK].copy_from_slice(&src[at..at + BLOCK]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_every_byte_at_every_skew_and_length() {
        let src: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let mut buf = vec![0u8; 20_000 + 4096 + 64];
        for len in [0, 1, 255, 2047, 2048, 2049, 4096, 10_000, 20_000] {
            for off in [0, 1, 16, 31, 32, 100] {
                // Place the destination at `off` past the source's address modulo 4 KiB.
                let base = buf.as_ptr() as usize;
                let want = (src.as_ptr() as usize + off) % 4096;
                let start = (want + 4096 - base % 4096) % 4096;
                let dst = &mut buf[start..start + len];
                dst.fill(0);
                copy_bytes(dst, &src[..len]);
                assert_eq!(dst, &src[..len], "len {len} skew {off}");
            }
        }
    }
}
