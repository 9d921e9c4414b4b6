//! What a timed message carries and how the senders start its clock: the header
//! (sequence number and stamp) and the optional settling fence before the stamp. Shared
//! by ferry's and iceoryx2's workers alike.

/// The environment variable that makes both senders [`settle`] before the stamp.
pub const SETTLE_VAR: &str = "FERRY_HANDOVER_SETTLE";

/// True when [`SETTLE_VAR`] is set (read once).
pub fn settling() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os(SETTLE_VAR).is_some())
}

/// A diagnostic, off unless [`SETTLE_VAR`] is set: a SeqCst fence between the payload
/// writes and the stamp, for ferry and iceoryx2 alike, so that the timed hand-over starts
/// with the sender's stores complete. Without it, a store of the page-writing loop that
/// still waits for its cache line when the stamp is taken (the header line of a reused
/// buffer, which the receiver read last time, is owned by the receiver's core) finishes
/// inside the timed window: with one page written there is nothing to hide it behind,
/// and in the far placement that added about 0.1 µs to a one-page hand-over (see
/// docs/benchmarks.md). Off by default: the bars are judged on the protocol without it.
pub fn settle() {
    if settling() {
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }
}

/// The header: sequence number and the stamp taken just before the hand-over.
pub fn write_header(s: &mut [u8], seq: u64, t0: u64) {
    s[0..8].copy_from_slice(&seq.to_ne_bytes());
    s[8..16].copy_from_slice(&t0.to_ne_bytes());
}

pub fn read_header(s: &[u8]) -> (u64, u64) {
    let w = |i: usize| u64::from_ne_bytes(s[i..i + 8].try_into().expect("8 bytes"));
    (w(0), w(8))
}
