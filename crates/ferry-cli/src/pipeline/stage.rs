//! One pipeline stage: receive a container, optionally unload and touch its pallets, ship it
//! on. The same function runs in a stage process (`ferry __stage`) or on a thread of the
//! pipeline process (`--in-process`); only the sockets it is given differ.

use std::fmt;
use std::hint::black_box;
use std::os::unix::net::UnixStream;

use ferry::containers::Container;

/// What a stage does to the containers passing through it.
#[derive(Clone, Debug)]
pub struct StageConfig {
    /// Stage number, 1-based, for messages.
    pub index: usize,
    /// Fraction (0..=1) of each pallet's valid bytes to unload, read and write back
    /// unchanged. 0 passes containers on unmapped.
    pub touch: f64,
    /// XOR every valid byte of every pallet with this constant (the whole container is
    /// unloaded, whatever `touch` says).
    pub xor: Option<u8>,
    /// Print the stage's mapping statistics to stderr when it ends.
    pub verbose: bool,
}

/// How a stage ended, when not by forwarding the end-of-data marker.
#[derive(Debug)]
pub enum StageError {
    /// A neighbour closed its socket: the upstream stage went away before the end of the
    /// data, or the downstream one stopped reading. The cause is reported elsewhere.
    NeighbourGone(String),
    /// This stage failed by itself.
    Failed(String),
}

impl fmt::Display for StageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NeighbourGone(m) | Self::Failed(m) => f.write_str(m),
        }
    }
}

/// Containers and bytes a stage forwarded.
#[derive(Copy, Clone, Debug, Default)]
pub struct StageReport {
    /// Data containers forwarded (the end marker not counted).
    pub containers: u64,
    /// Valid bytes in them.
    pub bytes: u64,
    /// How its unloads were mapped: at the pallet's previous address (hits), elsewhere
    /// because that address was taken (misses), or for the first time (cold).
    pub maps: ferry::containers::MapStats,
}

/// Runs a stage until the end-of-data marker (a container with no pallets) has been
/// received from `up` and shipped on to `down`.
pub fn run(
    cfg: &StageConfig,
    up: &UnixStream,
    down: &UnixStream,
) -> Result<StageReport, StageError> {
    let mut report = StageReport::default();
    loop {
        let mut c = match Container::receive(up) {
            Ok(c) => c,
            Err(ferry::Error::Disconnected) => {
                return Err(StageError::NeighbourGone(format!(
                    "stage {}: upstream closed before the end of the data",
                    cfg.index
                )))
            }
            Err(e) => {
                return Err(StageError::Failed(format!(
                    "stage {}: receive: {e}",
                    cfg.index
                )))
            }
        };
        let end = c.is_empty();
        if !end {
            touch(cfg, &mut c)
                .map_err(|e| StageError::Failed(format!("stage {}: unload: {e}", cfg.index)))?;
            let m = c.map_stats();
            report.maps.hits += m.hits;
            report.maps.misses += m.misses;
            report.maps.cold += m.cold;
            report.containers += 1;
            report.bytes += c
                .pallets()
                .iter()
                .map(|p| p.valid().len() as u64)
                .sum::<u64>();
        }
        if let Err(e) = c.ship(down) {
            return Err(match e.error {
                ferry::Error::Io(ref io)
                    if matches!(
                        io.kind(),
                        std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
                    ) =>
                {
                    StageError::NeighbourGone(format!(
                        "stage {}: downstream closed its socket",
                        cfg.index
                    ))
                }
                _ => StageError::Failed(format!("stage {}: {e}", cfg.index)),
            });
        }
        if end {
            if cfg.verbose {
                let m = &report.maps;
                eprintln!(
                    "ferry stage {}: {} containers; unloads at the same address as last time {}, moved {}, first mapping {} (hit rate {:.0}%)",
                    cfg.index,
                    report.containers,
                    m.hits,
                    m.misses,
                    m.cold,
                    100.0 * m.hit_rate()
                );
            }
            return Ok(report);
        }
    }
}

/// Unloads and touches the pallets as configured; leaves them unmapped when `touch` is 0
/// and there is no XOR.
fn touch(cfg: &StageConfig, c: &mut Container) -> ferry::Result<()> {
    if cfg.touch <= 0.0 && cfg.xor.is_none() {
        return Ok(());
    }
    for i in 0..c.len() {
        let valid = c.pallet(i)?.valid();
        if valid.is_empty() {
            continue;
        }
        let mut p = c.unload(i)?;
        let bytes = &mut p.as_mut_slice()[valid.clone()];
        match cfg.xor {
            Some(k) => bytes.iter_mut().for_each(|b| *b ^= k),
            None => {
                let n = ((bytes.len() as f64 * cfg.touch).ceil() as usize).min(bytes.len());
                // XOR with a zero the compiler cannot see: every byte is read and written
                // back unchanged, and the loop cannot be optimised away.
                let k = black_box(0u8);
                bytes[..n].iter_mut().for_each(|b| *b ^= k);
            }
        }
    }
    Ok(())
}
