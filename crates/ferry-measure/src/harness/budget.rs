//! How many messages each size gets, so that every size costs about the same
//! time: a byte budget per trial, bounded by a minimum and a maximum count.

use crate::protocol::{Pattern, Plan, Touch, Wait};

/// Per-trial message counts for a size sweep.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// Timed bytes to aim for in one trial of one size.
    pub bytes: usize,
    /// Fewest timed messages, however large the message.
    pub min: u32,
    /// Most timed messages, however small the message.
    pub max: u32,
    /// Untimed bytes before the timed ones ...
    pub warm_bytes: usize,
    /// ... in at most this many messages.
    pub warm_max: u32,
}

impl Budget {
    /// Timed messages per trial for each size.
    pub fn msgs(&self, sizes: &[usize]) -> Vec<u32> {
        sizes
            .iter()
            .map(|&s| (self.bytes / s.max(1)).clamp(self.min as usize, self.max as usize) as u32)
            .collect()
    }

    /// Warm-up messages per trial for each size (none once one message exceeds the warm-up bytes).
    pub fn warmup(&self, sizes: &[usize]) -> Vec<u32> {
        sizes
            .iter()
            .map(|&s| (self.warm_bytes / s.max(1)).min(self.warm_max as usize) as u32)
            .collect()
    }

    /// A plan over `sizes` with this budget's message counts: `trials` trials, the sink
    /// reading one word per page, no in-process stages.
    pub fn plan(&self, pattern: Pattern, wait: Wait, sizes: Vec<usize>, trials: u32) -> Plan {
        Plan {
            pattern,
            wait,
            touch: Touch::Word,
            msgs: self.msgs(&sizes),
            warmup: self.warmup(&sizes),
            sizes,
            trials,
            hops: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_bounded() {
        let b = Budget {
            bytes: 1 << 20,
            min: 2,
            max: 100,
            warm_bytes: 1 << 16,
            warm_max: 5,
        };
        assert_eq!(b.msgs(&[64, 1 << 16, 1 << 26]), vec![100, 16, 2]);
        assert_eq!(b.warmup(&[64, 1 << 16, 1 << 26]), vec![5, 1, 0]);
    }
}
