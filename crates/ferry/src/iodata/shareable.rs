//! Making an [`IoData`] shareable with other domains: every fragment in a lot.

use super::IoData;
use crate::error::Result;
use crate::region::PathAllocator;

impl IoData {
    /// This data with every fragment in a lot, so that another domain can read it in
    /// place: fragments already in a lot are kept (not copied); the others (heap
    /// memory, say) are copied into fbufs of `path`. Returns the data and the number of
    /// bytes copied, for the caller's stats (the visible fallback of a zero-copy path).
    pub fn in_lots(&self, path: &PathAllocator) -> Result<(IoData, usize)> {
        if self.fragments().iter().all(|f| f.lot_span().is_some()) {
            return Ok((self.clone(), 0));
        }
        let mut out = IoData::new();
        let mut copied = 0;
        for f in self.fragments() {
            if f.lot_span().is_some() {
                out.append(IoData::from_fragments([f.clone()]));
            } else {
                let mut m = path.alloc(f.len())?;
                m.write_at(0, f.as_slice());
                copied += f.len();
                out.append(m.freeze());
            }
        }
        Ok((out, copied))
    }
}
