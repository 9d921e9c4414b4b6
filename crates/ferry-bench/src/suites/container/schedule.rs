//! The schedule of `ferry-bench container`, which the harness side ([`super`]) and every
//! domain ([`super::domain`]) derive from the same [`Plan`]: the chain's shape, the
//! access amounts, the methods, the order of the batches of messages, and how a message
//! is cut into pallets.

use crate::protocol::Plan;

/// Processes in the chain.
pub const DOMAINS: usize = 5;
/// The domain that reads and writes the accessed bytes: the middle one.
pub const ACCESSOR: usize = DOMAINS / 2;
/// Pallets per container.
pub const PALLETS: usize = 5;
/// Stands for "all of the message" in [`ACCESSES`].
pub const ALL: usize = usize::MAX;
/// Bytes the accessing domain reads and writes, from the start of the message.
pub const ACCESSES: [usize; 4] = [0, 100 << 10, 1 << 20, ALL];
/// Bytes a copying domain moves per `read`/`write`: the pipe capacity the harness asks for.
pub const CHUNK: usize = 1 << 20;
/// Page size the pallets are rounded to.
const PAGE: usize = 4096;

/// How the message moves from domain to domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Container,
    Copy,
    VirtualMove,
}

/// Every method, in the order each group of the schedule runs them.
pub const METHODS: [Method; 3] = [Method::Container, Method::Copy, Method::VirtualMove];

impl Method {
    /// Short name for JSON records.
    pub fn name(self) -> &'static str {
        match self {
            Method::Container => "container",
            Method::Copy => "copy",
            Method::VirtualMove => "virtual-move",
        }
    }

    /// Name for tables and plot legends.
    pub fn label(self) -> &'static str {
        match self {
            Method::Container => "container shipping",
            Method::Copy => "physical copy (pipes)",
            Method::VirtualMove => "virtual move",
        }
    }
}

/// Bytes accessed for an entry of [`ACCESSES`] in a message of `size` bytes.
pub fn resolve(access: usize, size: usize) -> usize {
    access.min(size)
}

/// Messages of one method at one access amount in one trial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    pub trial: u32,
    /// Bytes accessed (resolved).
    pub access: usize,
    pub method: Method,
    pub warmup: u32,
    pub timed: u32,
}

/// Container shipping that does not access everything costs microseconds, so it always
/// gets at least this many timed messages, after at least [`CHEAP_WARMUP`] warm-ups.
pub const CHEAP_MSGS: u32 = 30;
/// Warm-up messages before the cheap batches' timed ones.
pub const CHEAP_WARMUP: u32 = 2;

/// Above this size the copy runs only with nothing and with everything accessed: it takes
/// seconds, and 100 KiB or 1 MiB of access changes that by well under 1%.
pub const COPY_ENDS_ONLY_ABOVE: usize = 64 << 20;

/// True if `method` runs at `access` bytes accessed of a `size`-byte message.
pub fn runs(method: Method, access: usize, size: usize) -> bool {
    !(method == Method::Copy && size > COPY_ENDS_ONLY_ABOVE && access != 0 && access < size)
}

/// The schedule: trials, then access amounts, then methods, so that the three methods
/// at one access amount run back to back. Uses the plan's first size, message count and
/// warm-up count (see [`CHEAP_MSGS`] and [`runs`] for the exceptions).
pub fn batches(plan: &Plan) -> Vec<Batch> {
    let size = plan.sizes.first().copied().unwrap_or(0);
    let warmup = plan.warmup.first().copied().unwrap_or(0);
    let timed = plan.msgs.first().copied().unwrap_or(1).max(1);
    let mut out = Vec::new();
    for trial in 0..plan.trials {
        for &a in &ACCESSES {
            let access = resolve(a, size);
            for &method in &METHODS {
                if !runs(method, access, size) {
                    continue;
                }
                let cheap = method == Method::Container && access < size;
                out.push(Batch {
                    trial,
                    access,
                    method,
                    warmup: if cheap {
                        warmup.max(CHEAP_WARMUP)
                    } else {
                        warmup
                    },
                    timed: if cheap { timed.max(CHEAP_MSGS) } else { timed },
                });
            }
        }
    }
    out
}

/// Size of every pallet for a `size`-byte message (equal page multiples), and the valid
/// length of each; the valid lengths add up to `size`.
pub fn pallet_layout(size: usize) -> (usize, Vec<usize>) {
    let per = size.div_ceil(PALLETS).div_ceil(PAGE).max(1) * PAGE;
    let valid = (0..PALLETS)
        .map(|i| size.saturating_sub(i * per).min(per))
        .collect();
    (per, valid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_adds_up() {
        for size in [10 << 20, 1 << 30, 4096, 12345] {
            let (per, valid) = pallet_layout(size);
            assert_eq!(per % PAGE, 0);
            assert_eq!(valid.iter().sum::<usize>(), size);
            assert!(valid.iter().all(|&v| v <= per));
        }
        assert_eq!(pallet_layout(10 << 20).0, 2 << 20);
    }
}
