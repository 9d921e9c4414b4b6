//! Region caching, for weak move and emulated weak move, and the queues of output regions
//! a domain reuses.
//!
//! Weak move promises no integrity: after output the region stays mapped in the sender and
//! the application simply gives it up. Emulated weak move queues the region when its
//! receivers release it, still mapped read-write, and serves the next system-allocated
//! buffer of its size class from that queue with no system call at all. (Plain weak move
//! returns the region to the path's free list instead, which is itself a LIFO of spans
//! the receivers already map, so on ferry the two differ less than in Genie, where an
//! uncached region had to be allocated and mapped afresh; the difference that remains
//! is that the queue is per domain, shared by every path, and feeds input too.)
//!
//! Why not `MADV_FREE` the cached pages: it is refused on memfd mappings (`EINVAL`), and
//! `MADV_DONTNEED` would cost a refault per page on reuse (590 µs per MiB, docs/semantics.md);
//! a cached shared region simply stays mapped. The queues are bounded
//! ([`PassingConfig::cached_regions`](super::PassingConfig::cached_regions) per queue);
//! beyond that a region goes back to its path.

use std::sync::Mutex;

use super::hide::Hidden;
use crate::segment::Segment;

/// Output regions waiting for reuse: cached (still mapped) and hidden (`PROT_NONE`).
#[derive(Default)]
pub(crate) struct Queues {
    pub cached: Mutex<Vec<Segment>>,
    pub hidden: Mutex<Vec<Hidden>>,
    /// Regions kept out of circulation because they could not be mapped back.
    pub lost: Mutex<Vec<Segment>>,
}

/// Takes from `q` a region whose span is the size class of `len` bytes.
pub(crate) fn take_class<T>(
    q: &Mutex<Vec<T>>,
    len: usize,
    seg: impl Fn(&T) -> &Segment,
) -> Option<T> {
    let (_, size) = crate::region::lot::class_of(len);
    let mut v = crate::sync::lock(q);
    let i = v.iter().rposition(|x| seg(x).len() == size)?;
    Some(v.swap_remove(i))
}
