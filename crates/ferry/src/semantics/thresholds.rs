//! Short-data thresholds: below these sizes an emulated semantics converts to its plain
//! copy form, because the page-table work it saves costs more than copying the bytes.
//!
//! Genie converts short data to copy for the same reason; what changed since the paper is
//! where the crossover lies. On the 2-vCPU VM this crate is developed on
//! (`/work/shared/GENIE.md`, medians): a hot 4 KiB `memcpy` takes 0.07–0.15 µs while
//! arming and disarming userfaultfd write protection on the same page takes 1.7–2.25 µs,
//! and at 1 MiB the copy (29–44 µs) and TCOW arm + disarm (37–50 µs) tie; at 16 MiB TCOW
//! wins 3–4x. So the default emulated-copy threshold is 1 MiB. Page swapping on input
//! never beat a hot copy up to 1 MiB and only tied it at 16 MiB, so the default swap
//! threshold is "never" (`usize::MAX`).
//!
//! The share forms pass references whatever the size and have no per-byte work, so they
//! need no threshold (0). Emulated move (region hiding, `mprotect(PROT_NONE)` and back:
//! 5.9–8.3 µs at 4 KiB, 40–57 µs at 1 MiB) pays per page like TCOW, so it gets the same
//! default; emulated weak move (region caching) keeps the region mapped, costs nothing per
//! byte, and has no threshold.
//!
//! `ferry calibrate` measures these crossovers on the running machine and writes them to a
//! calibration file (see the `calibration` module, owned by the calibration work); the
//! semantics layer reads that file when present and these defaults otherwise, and records
//! which in its stats.

/// Sizes (bytes) below which each emulated semantics converts to copy, and at or above
/// which input swaps whole pages instead of copying them.
///
/// An operation of `len` bytes uses the emulated mechanism when `len >= threshold`; a
/// threshold of 0 means "always emulate", `usize::MAX` means "never".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thresholds {
    /// Emulated copy (TCOW) output below this converts to copy.
    pub emulated_copy: usize,
    /// Emulated share below this converts to copy.
    pub emulated_share: usize,
    /// Emulated move (region hiding) below this converts to copy.
    pub emulated_move: usize,
    /// Emulated weak move (region caching) below this converts to copy.
    pub emulated_weak_move: usize,
    /// Input swaps whole pages in only at or above this size (`usize::MAX`: never).
    pub swap: usize,
}

/// Default emulated-copy threshold: TCOW ties a hot copy at about 1 MiB on this machine
/// class (see the module docs).
pub const DEFAULT_EMULATED_COPY: usize = 1 << 20;

/// Default emulated-move threshold: region hiding pays per page about what TCOW does.
pub const DEFAULT_EMULATED_MOVE: usize = 1 << 20;

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            emulated_copy: DEFAULT_EMULATED_COPY,
            emulated_share: 0,
            emulated_move: DEFAULT_EMULATED_MOVE,
            emulated_weak_move: 0,
            swap: usize::MAX,
        }
    }
}

impl Thresholds {
    /// Thresholds that never convert: every emulated form always uses its mechanism and
    /// input swaps whole pages whenever it can. For tests and for measuring the mechanisms.
    pub const NEVER_CONVERT: Thresholds = Thresholds {
        emulated_copy: 0,
        emulated_share: 0,
        emulated_move: 0,
        emulated_weak_move: 0,
        swap: 0,
    };

    /// The threshold for `semantics`, or `None` for the plain forms, which never convert.
    pub fn for_semantics(&self, semantics: super::Semantics) -> Option<usize> {
        use super::Semantics as S;
        match semantics {
            S::EmulatedCopy => Some(self.emulated_copy),
            S::EmulatedShare => Some(self.emulated_share),
            S::EmulatedMove => Some(self.emulated_move),
            S::EmulatedWeakMove => Some(self.emulated_weak_move),
            S::Copy | S::Share | S::Move | S::WeakMove => None,
        }
    }

    /// Sets the threshold a calibration-file key names (`threshold.emulated_copy`, ...,
    /// `threshold.swap`) from its value in bytes (`u64::MAX` or `never` for "never").
    /// Returns `Ok(false)` for a key that is not a threshold.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a threshold key with a value that is not a number.
    pub fn set_key(&mut self, key: &str, value: &str) -> Result<bool> {
        let slot = match key.trim() {
            "threshold.emulated_copy" => &mut self.emulated_copy,
            "threshold.emulated_share" => &mut self.emulated_share,
            "threshold.emulated_move" => &mut self.emulated_move,
            "threshold.emulated_weak_move" => &mut self.emulated_weak_move,
            "threshold.swap" => &mut self.swap,
            _ => return Ok(false),
        };
        let v = value.trim();
        *slot = if v == "never" {
            usize::MAX
        } else {
            let n: u64 = v
                .parse()
                .map_err(|_| Error::InvalidArgument("threshold value is not a byte count"))?;
            usize::try_from(n).unwrap_or(usize::MAX)
        };
        Ok(true)
    }

    /// The thresholds of the calibration file `ferry calibrate` writes
    /// (`$FERRY_CALIBRATION`, else `$XDG_CACHE_HOME/ferry/calibration`, else
    /// `$HOME/.cache/ferry/calibration`), starting from the defaults for keys it lacks;
    /// `None` if there is no such file or it does not parse.
    // TODO(merge with calib): the calibration module owns the file; once merged this
    // becomes `Calibration::load().map(|c| c.thresholds)`.
    pub fn from_calibration_file() -> Option<Thresholds> {
        let path = match std::env::var_os("FERRY_CALIBRATION") {
            Some(p) => std::path::PathBuf::from(p),
            None => match std::env::var_os("XDG_CACHE_HOME") {
                Some(x) => std::path::PathBuf::from(x).join("ferry/calibration"),
                None => std::path::PathBuf::from(std::env::var_os("HOME")?)
                    .join(".cache/ferry/calibration"),
            },
        };
        let text = std::fs::read_to_string(path).ok()?;
        let mut t = Thresholds::default();
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or("");
            if let Some((k, v)) = line.split_once('=') {
                t.set_key(k, v).ok()?;
            }
        }
        Some(t)
    }

    /// Whether an operation of `len` bytes with `semantics` converts to copy.
    pub fn converts(&self, semantics: super::Semantics, len: usize) -> bool {
        self.for_semantics(semantics).is_some_and(|t| len < t)
    }
}

use crate::error::{Error, Result};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::semantics::Semantics;

    #[test]
    fn edges() {
        let t = Thresholds::default();
        assert!(t.converts(Semantics::EmulatedCopy, DEFAULT_EMULATED_COPY - 1));
        assert!(!t.converts(Semantics::EmulatedCopy, DEFAULT_EMULATED_COPY));
        assert!(!t.converts(Semantics::EmulatedShare, 1));
        assert!(!t.converts(Semantics::Copy, 0));
        assert!(!t.converts(Semantics::Move, 0));
        assert!(!Thresholds::NEVER_CONVERT.converts(Semantics::EmulatedMove, 1));
        assert_eq!(t.swap, usize::MAX);
    }

    #[test]
    fn keys() {
        let mut t = Thresholds::default();
        assert!(t.set_key("threshold.emulated_copy ", " 4096").unwrap());
        assert!(t.set_key("threshold.swap", "never").unwrap());
        assert!(!t.set_key("fit.copy", "0.1 2 0.9").unwrap());
        assert!(t.set_key("threshold.emulated_move", "x").is_err());
        assert_eq!(t.emulated_copy, 4096);
        assert_eq!(t.swap, usize::MAX);
    }
}
