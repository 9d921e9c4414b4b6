//! The calibration file and the cost model built on it (Genie's Tables 6 and 7, with
//! ferry's own mechanisms).
//!
//! `ferry calibrate` times each primitive that a semantics may pay for at several sizes,
//! fits a line `ns = a * bytes + b` through the medians, and writes the fits and the
//! thresholds derived from them to a plain text file. An application loads that file
//! ([`Calibration::load`]) and gives its thresholds to the passing layer
//! ([`PassingConfig::thresholds`](super::PassingConfig::thresholds)), which uses them to
//! decide, per operation, whether an emulated form is worth its fixed costs or should
//! convert to copy; given none, it uses [`Thresholds::default`]. The library reads the file
//! only when asked to, and no environment variable.
//!
//! # The file
//!
//! One `key = value` per line; `#` starts a comment (whole line or trailing). Where it
//! lives: where `ferry calibrate --out` wrote it; by default `ferry/calibration` under the
//! user's cache directory ([`Calibration::default_path`]).
//!
//! ```text
//! # ferry calibration, written by `ferry calibrate` on <date>, <machine>
//! fit.copy_in = 0.012 85 0.999     # a (ns per byte), b (ns), r²
//! fit.copy_out = 0.05 900 0.998 2097152 0.21 -2000   # ... and from 2 MiB on, a2 b2
//! threshold.emulated_copy = 1048576
//! threshold.swap = 18446744073709551615   # never
//! ```
//!
//! Keys are `fit.<primitive>` (the primitives are listed in [`primitive`]): three numbers
//! `a b r2` for one line, or six, `a b r2 from a2 b2`, for two (the cache knee: one line
//! below `from` bytes, another from there on; `r2` is then the two lines' together; see
//! [`Fit`]). Files with three numbers per fit (the first format) read as before. And `threshold.<name>` (a byte count, or `never`) for each field of [`Thresholds`].
//! A threshold the file leaves out keeps its default. Unknown keys, duplicates, and
//! values that do not parse are errors naming the line, never silently skipped.
//!
//! # The model
//!
//! An end-to-end latency is the sum of the primitives on the critical path, from the
//! sender's output call to the receiver holding the data ([`Calibration::recipe`]):
//!
//! | semantics | sender | between | receiver |
//! |---|---|---|---|
//! | copy | `copy_in` (the bytes into a fresh fbuf) | `handover` | `copy_out` (peer's read-only lot into the app buffer) |
//! | emulated copy | write-protect the app's pages (`protect_uffd`, or `protect_mprotect` when userfaultfd was not calibrated) | `handover` | `copy_out` |
//! | share | `wire` (mlock) | `handover` | `copy_out` |
//! | emulated share | — | `handover` | `copy_out` |
//! | move | `region_unmap` (the region's pages leave the sender's mapping) | `handover` | reads in place |
//! | emulated move | `hide` (the same move of the pages) | `handover` | reads in place |
//! | weak move | — (the region stays mapped, by contract untouched) | `handover` | reads in place |
//! | emulated weak move | — (region cached) | `handover` | reads in place |
//!
//! This follows what [`Passing`](super::Passing) does: application-allocated input copies
//! into the application's buffer (at or above `threshold.swap`, `Passing::input_into_app`
//! swaps the lined-up whole pages of an `AppBuffer` in and copies the rest), and
//! system-allocated input hands the receiver the sender's pages. [`Calibration::predict`]
//! follows input into a plain buffer (`recv_into`), which always copies;
//! [`Calibration::predict_in_place`] follows input in place (`Passing::recv_in_place`,
//! share and emulated share), which drops the copy out.
//!
//! Below its threshold an emulated form converts to copy, so it is predicted as copy
//! (a system-allocated one without the copy out: its receiver still inputs in place).
//! Work done after the receiver has the data (unprotecting at release, unwiring,
//! reinstating a hidden region on reuse) is off the critical path, as in Genie's model,
//! where only the sender's prepare-time and the receiver's dispose-time work counted.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::thresholds::Thresholds;
use super::Semantics;
use crate::{Error, Result};

/// The primitives `ferry calibrate` measures: the `<primitive>` of `fit.<primitive>`.
pub mod primitive {
    /// Hot memcpy from the application's buffer into an fbuf (Genie's copyin), the fbuf's
    /// lines last read by the receiver on the other CPU (copy and emulated copy: their
    /// receiver copies every byte out).
    pub const COPY_IN: &str = "copy_in";
    /// The same copy into an fbuf no other CPU read since this one wrote it: a
    /// system-allocated form converted to copy, whose receiver takes the fbuf in place and
    /// reads only what it needs.
    pub const COPY_IN_LOCAL: &str = "copy_in_local";
    /// Copy out of a peer's read-only lot mapping into the application's buffer (copyout).
    pub const COPY_OUT: &str = "copy_out";
    /// One-way hand-over between two pinned processes through this layer, with no work
    /// on the data (weak move: `send_sys`, `recv_sys`, the header read): Genie's base
    /// latency plus referencing, the part every semantics pays.
    pub const HANDOVER: &str = "handover";
    /// Emulated copy's output on the sender: the application buffer's pages
    /// write-protected (`UFFDIO_WRITEPROTECT`) through the TCOW engine, its bookkeeping
    /// included (the name is the file's).
    pub const PROTECT_UFFD: &str = "protect_uffd";
    /// Removing that write protection.
    pub const UNPROTECT_UFFD: &str = "unprotect_uffd";
    /// `mprotect(PROT_READ)` of a memfd mapping.
    pub const PROTECT_MPROTECT: &str = "protect_mprotect";
    /// `mprotect(PROT_READ | PROT_WRITE)` back.
    pub const UNPROTECT_MPROTECT: &str = "unprotect_mprotect";
    /// A write to protected pages handled by copy and replace, per byte of pages written.
    pub const TCOW_FAULT: &str = "tcow_fault";
    /// Region hiding: the region's pages moved out of the lot's mapping (`mremap`).
    pub const HIDE: &str = "hide";
    /// Reinstating a hidden region: its pages moved back (`mremap`).
    pub const REINSTATE: &str = "reinstate";
    /// `mmap(MAP_SHARED | MAP_FIXED)` of a lot span over the application's buffer.
    pub const SWAP: &str = "swap";
    /// `mremap(MREMAP_FIXED)` of a populated range within one process.
    pub const MREMAP: &str = "mremap";
    /// A new region: `memfd_create` + `ftruncate`.
    pub const REGION_CREATE: &str = "region_create";
    /// Mapping a filled region and reading it in (one word per page).
    pub const REGION_MAP: &str = "region_map";
    /// Move's output: the region unmapped below 256 KiB, its pages moved out of the lot's
    /// mapping (`mremap`, as hiding) from there (the name is the file's).
    pub const REGION_UNMAP: &str = "region_unmap";
    /// Share's output on the sender: an application buffer's pages wired (`mlock` of its
    /// view, through `Passing`; the lot maps the same pages, which makes locking them
    /// dearer than locking a private test mapping).
    pub const WIRE: &str = "wire";
    /// `munlock`.
    pub const UNWIRE: &str = "unwire";

    /// Every primitive, in the order `ferry calibrate` reports them.
    pub const ALL: &[&str] = &[
        COPY_IN,
        COPY_IN_LOCAL,
        COPY_OUT,
        HANDOVER,
        PROTECT_UFFD,
        UNPROTECT_UFFD,
        PROTECT_MPROTECT,
        UNPROTECT_MPROTECT,
        TCOW_FAULT,
        HIDE,
        REINSTATE,
        SWAP,
        MREMAP,
        REGION_CREATE,
        REGION_MAP,
        REGION_UNMAP,
        WIRE,
        UNWIRE,
    ];
}

/// A line `ns = a * bytes + b` fitted by least squares, with its r²; optionally a second
/// line from [`FitSegment::from`] bytes on.
///
/// One straight line cannot follow a copy's cost across the last-level cache: a copy that
/// fits in the cache runs several times faster per byte than one that streams through
/// memory, so a line through both predicts neither. `ferry calibrate` fits two lines, split
/// where the two fit the points best, when that is clearly better than one.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Fit {
    /// Nanoseconds per byte (below [`above`](Self::above)'s `from`, if any).
    pub a: f64,
    /// Nanoseconds.
    pub b: f64,
    /// Coefficient of determination of the fit (1: every point on the line or lines).
    pub r2: f64,
    /// The line for large sizes, if the fit has two.
    pub above: Option<FitSegment>,
}

/// The upper line of a two-line [`Fit`]: `ns = a * bytes + b` from `from` bytes on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FitSegment {
    /// The first size this line applies to.
    pub from: usize,
    /// Nanoseconds per byte.
    pub a: f64,
    /// Nanoseconds.
    pub b: f64,
}

impl Fit {
    /// One line.
    pub fn line(a: f64, b: f64, r2: f64) -> Fit {
        Fit {
            a,
            b,
            r2,
            above: None,
        }
    }

    /// The predicted nanoseconds for `bytes`.
    pub fn at(&self, bytes: usize) -> f64 {
        match self.above {
            Some(s) if bytes >= s.from => s.a * bytes as f64 + s.b,
            _ => self.a * bytes as f64 + self.b,
        }
    }
}

/// One primitive on an operation's critical path, applied to `bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Term {
    /// A name from [`primitive`].
    pub primitive: &'static str,
    /// The bytes it works on.
    pub bytes: usize,
}

/// The measured fits and the thresholds derived from them.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Calibration {
    /// One fit per primitive, keyed by its name in [`primitive`].
    pub fits: BTreeMap<String, Fit>,
    /// The sizes the passing layer switches at.
    pub thresholds: Thresholds,
}

/// The threshold keys of the file, with their field in [`Thresholds`].
const THRESHOLD_KEYS: [&str; 5] = [
    "emulated_copy",
    "emulated_share",
    "emulated_move",
    "emulated_weak_move",
    "swap",
];

fn threshold_mut<'a>(t: &'a mut Thresholds, key: &str) -> Option<&'a mut usize> {
    Some(match key {
        "emulated_copy" => &mut t.emulated_copy,
        "emulated_share" => &mut t.emulated_share,
        "emulated_move" => &mut t.emulated_move,
        "emulated_weak_move" => &mut t.emulated_weak_move,
        "swap" => &mut t.swap,
        _ => return None,
    })
}

fn bad(line: usize, why: impl Into<String>) -> Error {
    Error::BadCalibration {
        line,
        why: why.into(),
    }
}

fn parse_number(line: usize, key: &str, v: &str) -> Result<f64> {
    let x: f64 = v
        .parse()
        .map_err(|_| bad(line, format!("{key}: {v:?} is not a number")))?;
    if !x.is_finite() {
        return Err(bad(line, format!("{key}: {v:?} is not a finite number")));
    }
    Ok(x)
}

impl Calibration {
    /// Reads the text of a calibration file.
    ///
    /// Fails with [`Error::BadCalibration`] naming the first line that is not a comment,
    /// a blank, a `fit.<primitive> = a b r2` or a `threshold.<name> = bytes|never`, and
    /// on a key given twice.
    pub fn parse(text: &str) -> Result<Calibration> {
        let mut cal = Calibration::default();
        let mut seen: Vec<String> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let n = i + 1;
            let content = raw.split('#').next().unwrap_or("").trim();
            if content.is_empty() {
                continue;
            }
            let (key, value) = content
                .split_once('=')
                .ok_or_else(|| bad(n, format!("expected `key = value`, found {content:?}")))?;
            let (key, value) = (key.trim(), value.trim());
            if seen.iter().any(|k| k == key) {
                return Err(bad(n, format!("{key} is given twice")));
            }
            if let Some(name) = key.strip_prefix("fit.") {
                if !primitive::ALL.contains(&name) {
                    return Err(bad(
                        n,
                        format!(
                            "unknown primitive {name:?} (known: {})",
                            primitive::ALL.join(", ")
                        ),
                    ));
                }
                let nums: Vec<&str> = value.split_whitespace().collect();
                if nums.len() != 3 && nums.len() != 6 {
                    return Err(bad(
                        n,
                        format!(
                            "{key} needs three numbers `a b r2` (ns per byte, ns, r²) or six \
                             `a b r2 from a2 b2` (and from `from` bytes on, a second line), \
                             found {value:?}"
                        ),
                    ));
                }
                let mut fit = Fit::line(
                    parse_number(n, key, nums[0])?,
                    parse_number(n, key, nums[1])?,
                    parse_number(n, key, nums[2])?,
                );
                if nums.len() == 6 {
                    fit.above = Some(FitSegment {
                        from: nums[3].parse().map_err(|_| {
                            bad(n, format!("{key}: {:?} is not a byte count", nums[3]))
                        })?,
                        a: parse_number(n, key, nums[4])?,
                        b: parse_number(n, key, nums[5])?,
                    });
                }
                cal.fits.insert(name.to_string(), fit);
            } else if let Some(name) = key.strip_prefix("threshold.") {
                let slot = threshold_mut(&mut cal.thresholds, name).ok_or_else(|| {
                    bad(
                        n,
                        format!(
                            "unknown threshold {name:?} (known: {})",
                            THRESHOLD_KEYS.join(", ")
                        ),
                    )
                })?;
                *slot = if value == "never" {
                    usize::MAX
                } else {
                    value.parse().map_err(|_| {
                        bad(
                            n,
                            format!("{key}: {value:?} is not a byte count or `never`"),
                        )
                    })?
                };
            } else {
                return Err(bad(
                    n,
                    format!("unknown key {key:?}: expected fit.<primitive> or threshold.<name>"),
                ));
            }
            seen.push(key.to_string());
        }
        Ok(cal)
    }

    /// The file's text: every fit, then every threshold. [`Calibration::parse`] reads it
    /// back to an equal value.
    pub fn to_text(&self) -> String {
        let mut s = String::from(
            "# ferry calibration: fit.<primitive> = a (ns/byte) b (ns) r2 [from (bytes) a2 b2]\n",
        );
        for (name, f) in &self.fits {
            // `{:e}`-free shortest round-trip formatting keeps parse(to_text) exact.
            match f.above {
                None => {
                    let _ = writeln!(s, "fit.{name} = {:?} {:?} {:?}", f.a, f.b, f.r2);
                }
                Some(u) => {
                    let _ = writeln!(
                        s,
                        "fit.{name} = {:?} {:?} {:?} {} {:?} {:?}",
                        f.a, f.b, f.r2, u.from, u.a, u.b
                    );
                }
            }
        }
        let mut t = self.thresholds;
        for key in THRESHOLD_KEYS {
            let v = *threshold_mut(&mut t, key).expect("known key");
            if v == usize::MAX {
                let _ = writeln!(s, "threshold.{key} = {v}   # never");
            } else {
                let _ = writeln!(s, "threshold.{key} = {v}");
            }
        }
        s
    }

    /// Where `ferry calibrate` writes the calibration file unless told otherwise:
    /// `<cache_home>/ferry/calibration`, where `cache_home` is the user's cache directory
    /// (by the XDG convention, `$XDG_CACHE_HOME` when set and not empty, else
    /// `$HOME/.cache`). The library reads no environment variable: the caller resolves
    /// `cache_home` (the `ferry` tool does so as described).
    ///
    /// ```
    /// use std::path::Path;
    /// use ferry::semantics::Calibration;
    /// let p = Calibration::default_path(Path::new("/home/ann/.cache"));
    /// assert_eq!(p, Path::new("/home/ann/.cache/ferry/calibration"));
    /// ```
    pub fn default_path(cache_home: &Path) -> PathBuf {
        cache_home.join("ferry").join("calibration")
    }

    /// Reads the calibration file at `path`: `Ok(None)` when it does not exist, an error
    /// when it cannot be read or does not parse.
    ///
    /// ```no_run
    /// use std::path::Path;
    /// use ferry::semantics::{Calibration, PassingConfig};
    /// # fn main() -> ferry::Result<()> {
    /// let path = Calibration::default_path(Path::new("/home/ann/.cache"));
    /// let config = PassingConfig {
    ///     thresholds: Calibration::load(&path)?.map(|c| c.thresholds),
    ///     ..PassingConfig::default()
    /// };
    /// # let _ = config;
    /// # Ok(()) }
    /// ```
    pub fn load(path: &Path) -> Result<Option<Calibration>> {
        match std::fs::read_to_string(path) {
            Ok(text) => Calibration::parse(&text).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The primitives on the critical path of one `bytes`-long operation with `s`,
    /// given this calibration's thresholds (see the module docs' table).
    pub fn recipe(&self, s: Semantics, bytes: usize) -> Vec<Term> {
        self.recipe_with(&self.thresholds, s, bytes)
    }

    fn recipe_with(&self, t: &Thresholds, s: Semantics, bytes: usize) -> Vec<Term> {
        use primitive::*;
        let term = |primitive, bytes| Term { primitive, bytes };
        let page = crate::sys::page_size();
        let pages = bytes.div_ceil(page) * page;
        let handover = term(HANDOVER, bytes);
        if t.converts(s, bytes) && s.allocator() == super::Allocator::System {
            // Output copies into a fresh fbuf; the receiver still takes it in place
            // (`recv_sys`), so there is no copy out, and no CPU but ours touched the
            // fbuf's lines since (a calibration file from before that primitive: copy_in).
            let copy = if self.fits.contains_key(COPY_IN_LOCAL) {
                COPY_IN_LOCAL
            } else {
                COPY_IN
            };
            return vec![term(copy, bytes), handover];
        }
        let s = if t.converts(s, bytes) {
            Semantics::Copy
        } else {
            s
        };
        match s {
            Semantics::Copy => vec![term(COPY_IN, bytes), handover, term(COPY_OUT, bytes)],
            Semantics::EmulatedCopy => {
                let protect = if self.fits.contains_key(PROTECT_UFFD) {
                    PROTECT_UFFD
                } else {
                    PROTECT_MPROTECT
                };
                vec![term(protect, pages), handover, term(COPY_OUT, bytes)]
            }
            Semantics::Share => vec![term(WIRE, pages), handover, term(COPY_OUT, bytes)],
            Semantics::EmulatedShare => vec![handover, term(COPY_OUT, bytes)],
            Semantics::Move => vec![term(REGION_UNMAP, pages), handover],
            Semantics::EmulatedMove => vec![term(HIDE, pages), handover],
            Semantics::WeakMove | Semantics::EmulatedWeakMove => vec![handover],
        }
    }

    fn sum(&self, terms: &[Term]) -> Option<f64> {
        terms
            .iter()
            .map(|t| self.fits.get(t.primitive).map(|f| f.at(t.bytes)))
            .sum()
    }

    /// The primitives on the critical path when the receiver inputs in place
    /// ([`Passing::recv_in_place`](super::Passing::recv_in_place)): as
    /// [`recipe`](Self::recipe) without the copy out. `None` for copy and emulated copy,
    /// which never input in place.
    pub fn recipe_in_place(&self, s: Semantics, bytes: usize) -> Option<Vec<Term>> {
        if !s.may_input_in_place() {
            return None;
        }
        let mut terms = self.recipe(s, bytes);
        // Below its threshold emulated share converts to copy on output; the receiver
        // still reads the copy's fbuf in place.
        terms.retain(|t| t.primitive != primitive::COPY_OUT);
        Some(terms)
    }

    /// The predicted end-to-end latency in ns when the receiver inputs in place: the sum
    /// of [`recipe_in_place`](Self::recipe_in_place)'s fits.
    pub fn predict_in_place(&self, s: Semantics, bytes: usize) -> Option<f64> {
        self.sum(&self.recipe_in_place(s, bytes)?)
    }

    /// The predicted end-to-end latency in ns of one `bytes`-long operation with `s`:
    /// the sum of its [`Calibration::recipe`]'s fits, or `None` when one of them was not
    /// calibrated.
    pub fn predict(&self, s: Semantics, bytes: usize) -> Option<f64> {
        self.sum(&self.recipe(s, bytes))
    }

    /// Sets the thresholds from the fits: each emulated form's threshold becomes the
    /// smallest size from which, at every larger size up to 1 GiB, its own costs times
    /// `1 + margin` are below what converting costs (`usize::MAX` if there is none:
    /// always convert); `swap` becomes the smallest such size where swapping beats
    /// `copy_out`. Its own costs are the terms of its recipe that the conversion's recipe
    /// does not share (emulated copy: the protection, against copy's copy in): the shared
    /// terms (hand-over, copy out) are the same work either way, and a margin on them
    /// would demand a saving the form cannot make where they dominate (copy out is most
    /// of both at 4 MiB).
    /// Sizes are scanned in steps of a quarter power of two from 64 B, so a threshold is
    /// exact to within 19%.
    pub fn derive_thresholds(&mut self, margin: f64) {
        let grid = size_grid();
        let never = Thresholds {
            swap: usize::MAX,
            ..Thresholds::NEVER_CONVERT
        };
        let first_win = |wins: &dyn Fn(usize) -> Option<bool>| -> usize {
            let mut from = usize::MAX;
            for &b in grid.iter().rev() {
                match wins(b) {
                    Some(true) => from = b,
                    _ => break,
                }
            }
            from
        };
        // What a conversion costs instead: copy, or for a system-allocated form, its copy
        // into a fresh fbuf read in place (no copy out).
        let always = Thresholds {
            emulated_copy: usize::MAX,
            emulated_share: usize::MAX,
            emulated_move: usize::MAX,
            emulated_weak_move: usize::MAX,
            swap: usize::MAX,
        };
        // Each recipe's terms that the other one does not have.
        let own = |a: &[Term], b: &[Term]| -> Vec<Term> {
            a.iter().filter(|x| !b.contains(x)).copied().collect()
        };
        let mut t = self.thresholds;
        for s in [
            Semantics::EmulatedCopy,
            Semantics::EmulatedShare,
            Semantics::EmulatedMove,
            Semantics::EmulatedWeakMove,
        ] {
            let th = first_win(&|b| {
                let e = self.recipe_with(&never, s, b);
                let c = self.recipe_with(&always, s, b);
                let (e, c) = (self.sum(&own(&e, &c))?, self.sum(&own(&c, &e))?);
                Some(e * (1.0 + margin) < c)
            });
            let slot = match s {
                Semantics::EmulatedCopy => &mut t.emulated_copy,
                Semantics::EmulatedShare => &mut t.emulated_share,
                Semantics::EmulatedMove => &mut t.emulated_move,
                _ => &mut t.emulated_weak_move,
            };
            *slot = if th == grid[0] { 0 } else { th };
        }
        let fit = |k: &str| self.fits.get(k).copied();
        t.swap = first_win(&|b| {
            Some(fit(primitive::SWAP)?.at(b) * (1.0 + margin) < fit(primitive::COPY_OUT)?.at(b))
        });
        self.thresholds = t;
    }
}

/// 64 B to 1 GiB in steps of 2^(1/4), page multiples from one page up.
fn size_grid() -> Vec<usize> {
    let page = crate::sys::page_size();
    let mut v: Vec<usize> = (24..=120)
        .map(|q| 2f64.powf(q as f64 / 4.0) as usize)
        .map(|b| if b >= page { b / page * page } else { b })
        .collect();
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Calibration {
        let mut c = Calibration::default();
        for (k, a, b) in [
            (primitive::COPY_IN, 0.1, 50.0),
            (primitive::COPY_OUT, 0.2, 100.0),
            (primitive::HANDOVER, 0.0, 2000.0),
            (primitive::PROTECT_UFFD, 0.01, 3000.0),
            (primitive::WIRE, 0.001, 1500.0),
            (primitive::HIDE, 0.002, 5000.0),
            (primitive::REGION_MAP, 0.05, 4000.0),
            (primitive::REGION_UNMAP, 0.03, 1000.0),
            (primitive::SWAP, 0.25, 6000.0),
        ] {
            c.fits.insert(k.into(), Fit::line(a, b, 0.99));
        }
        c.thresholds.swap = 1 << 22;
        c
    }

    #[test]
    fn text_round_trips() {
        let mut c = sample();
        c.fits
            .insert("mremap".into(), Fit::line(1.0 / 3.0, -7.25e-3, 0.123456789));
        let text = c.to_text();
        assert_eq!(Calibration::parse(&text).unwrap(), c);
        assert!(text.contains("threshold.swap = 4194304\n"), "{text}");
    }

    #[test]
    fn two_line_fits_round_trip_and_old_files_still_load() {
        let mut c = sample();
        let mut f = Fit::line(0.1, 50.0, 0.97);
        f.above = Some(FitSegment {
            from: 4 << 20,
            a: 0.25,
            b: -3000.5,
        });
        c.fits.insert(primitive::COPY_OUT.into(), f);
        let text = c.to_text();
        assert_eq!(Calibration::parse(&text).unwrap(), c);
        // Each line applies on its own side of `from`.
        assert_eq!(f.at(1000), 0.1 * 1000.0 + 50.0);
        assert_eq!(f.at(4 << 20), 0.25 * (4 << 20) as f64 - 3000.5);
        // A file of the first format (three numbers per fit) reads as one line.
        let old = Calibration::parse("fit.copy_out = 0.2 100 0.99\n").unwrap();
        assert_eq!(old.fits["copy_out"], Fit::line(0.2, 100.0, 0.99));
        assert!(old.fits["copy_out"].above.is_none());
        // Four or five numbers, or a `from` that is no byte count, are errors.
        for bad in [
            "fit.copy_out = 0.2 100 0.99 5\n",
            "fit.copy_out = 0.2 100 0.99 5 1\n",
            "fit.copy_out = 0.2 100 0.99 x 1 2\n",
        ] {
            assert!(
                matches!(
                    Calibration::parse(bad),
                    Err(Error::BadCalibration { line: 1, .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn in_place_input_drops_the_copy_out() {
        let c = sample();
        let b = 1 << 20;
        for s in [Semantics::Copy, Semantics::EmulatedCopy] {
            assert!(c.predict_in_place(s, b).is_none(), "{s}");
        }
        let share = c.predict(Semantics::EmulatedShare, b).unwrap();
        let in_place = c.predict_in_place(Semantics::EmulatedShare, b).unwrap();
        assert_eq!(share - in_place, c.fits[primitive::COPY_OUT].at(b));
        assert_eq!(
            c.predict_in_place(Semantics::Move, b),
            c.predict(Semantics::Move, b)
        );
    }

    #[test]
    fn comments_blanks_never_and_defaults() {
        let c = Calibration::parse(
            "# header\n\n  fit.copy_in = 0.5 10 1   # trailing\nthreshold.swap = never\n",
        )
        .unwrap();
        assert_eq!(c.fits["copy_in"], Fit::line(0.5, 10.0, 1.0));
        assert_eq!(c.thresholds.swap, usize::MAX);
        assert_eq!(
            c.thresholds.emulated_copy,
            Thresholds::default().emulated_copy
        );
    }

    #[test]
    fn bad_lines_are_rejected_with_their_line() {
        let cases = [
            ("fit.copy_in = 1 2\n", 1, "three numbers"),
            ("\nfit.nonsense = 1 2 3\n", 2, "unknown primitive"),
            ("threshold.swap = lots\n", 1, "byte count"),
            ("threshold.bogus = 4\n", 1, "unknown threshold"),
            ("x\n", 1, "key = value"),
            ("colour = blue\n", 1, "unknown key"),
            ("fit.swap = 1 2 3\nfit.swap = 1 2 3\n", 2, "twice"),
            ("fit.swap = 1 NaN 3\n", 1, "finite"),
            ("fit.swap = 1 two 3\n", 1, "not a number"),
            ("threshold.swap = -1\n", 1, "byte count"),
        ];
        for (text, want_line, want) in cases {
            match Calibration::parse(text) {
                Err(Error::BadCalibration { line, why }) => {
                    assert_eq!(line, want_line, "{text:?}: {why}");
                    assert!(why.contains(want), "{text:?}: {why}");
                }
                other => panic!("{text:?} gave {other:?}"),
            }
        }
    }

    #[test]
    fn missing_file_is_none_and_a_bad_one_an_error() {
        let dir = std::env::temp_dir().join(format!("ferry-cal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("calibration");
        assert!(Calibration::load(&path).unwrap().is_none());
        std::fs::write(&path, sample().to_text()).unwrap();
        assert_eq!(Calibration::load(&path).unwrap(), Some(sample()));
        std::fs::write(&path, "fit.copy_in = 1\n").unwrap();
        assert!(matches!(
            Calibration::load(&path),
            Err(Error::BadCalibration { line: 1, .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn predict_sums_the_recipe_and_converts_below_thresholds() {
        let mut c = sample();
        c.thresholds.emulated_copy = 1 << 20;
        let copy = |b: usize| 0.1 * b as f64 + 50.0 + 2000.0 + 0.2 * b as f64 + 100.0;
        assert_eq!(c.predict(Semantics::Copy, 1000), Some(copy(1000)));
        // Below the threshold emulated copy is copy; above, protect + hand-over + copy out.
        assert_eq!(c.predict(Semantics::EmulatedCopy, 4096), Some(copy(4096)));
        let b = 2 << 20;
        let want = 0.01 * b as f64 + 3000.0 + 2000.0 + 0.2 * b as f64 + 100.0;
        assert_eq!(c.predict(Semantics::EmulatedCopy, b), Some(want));
        // Protection covers whole pages; the copy out only the bytes.
        let b = (4 << 20) + 100;
        let page = crate::sys::page_size();
        assert_eq!(
            c.recipe(Semantics::EmulatedCopy, b),
            vec![
                Term {
                    primitive: primitive::PROTECT_UFFD,
                    bytes: b.div_ceil(page) * page
                },
                Term {
                    primitive: primitive::HANDOVER,
                    bytes: b
                },
                Term {
                    primitive: primitive::COPY_OUT,
                    bytes: b
                },
            ]
        );
        assert_eq!(
            c.predict(Semantics::EmulatedWeakMove, 1 << 26),
            Some(2000.0)
        );
        // A system-allocated form below its threshold copies into a fresh fbuf, which its
        // receiver still reads in place: copy in and hand-over, no copy out.
        c.thresholds.emulated_move = 1 << 20;
        assert_eq!(
            c.predict(Semantics::EmulatedMove, 4096),
            Some(0.1 * 4096.0 + 50.0 + 2000.0)
        );
        // With the local copy calibrated (no other CPU read the fbuf), that copy is it.
        c.fits
            .insert(primitive::COPY_IN_LOCAL.into(), Fit::line(0.03, 40.0, 0.99));
        assert_eq!(
            c.predict(Semantics::EmulatedMove, 4096),
            Some(0.03 * 4096.0 + 40.0 + 2000.0)
        );
        assert_eq!(c.predict(Semantics::Copy, 1000), Some(copy(1000)));
        // A primitive that was not calibrated gives no prediction.
        c.fits.remove(primitive::HIDE);
        assert_eq!(c.predict(Semantics::EmulatedMove, 1 << 26), None);
    }

    #[test]
    fn thresholds_fall_where_the_lines_cross() {
        let mut c = sample();
        c.derive_thresholds(0.1);
        let t = c.thresholds;
        // Emulated copy: its own cost is the protection (0.01B + 3000, whole pages)
        // against copy's copy in (0.1B + 50); the hand-over and the copy out are common.
        // With the margin they cross near 36 KB.
        let cross = |t: usize| {
            let p = t.div_ceil(4096) * 4096;
            let e = 1.1 * (0.01 * p as f64 + 3000.0);
            let k = 0.1 * t as f64 + 50.0;
            e < k
        };
        assert!(cross(t.emulated_copy), "{t:?}");
        assert!(!cross(t.emulated_copy * 4 / 5), "{t:?}");
        assert!(
            t.emulated_copy > 32 << 10 && t.emulated_copy < 48 << 10,
            "{t:?}"
        );
        // Emulated weak move and emulated share have no cost of their own (a hand-over,
        // and for share the copy out, both common to their conversions): they never
        // convert. Emulated move's own cost, hiding (0.002B + 5000), beats the copy in of
        // its conversion (0.1B + 50) with the margin from about 56 KB.
        assert_eq!(t.emulated_weak_move, 0, "{t:?}");
        assert_eq!(t.emulated_share, 0, "{t:?}");
        assert!(
            t.emulated_move > 48 << 10 && t.emulated_move < 72 << 10,
            "{t:?}"
        );
        // Swapping (0.25 ns/B) never beats copying out (0.2 ns/B) at large sizes.
        assert_eq!(t.swap, usize::MAX);
        // A copy that costs nothing is never beaten: emulated forms always convert.
        c.fits
            .insert(primitive::COPY_IN.into(), Fit::line(0.0, 0.0, 1.0));
        c.fits
            .insert(primitive::COPY_OUT.into(), Fit::line(0.0, 0.0, 1.0));
        c.derive_thresholds(0.1);
        assert_eq!(c.thresholds.emulated_weak_move, usize::MAX);
    }
}
