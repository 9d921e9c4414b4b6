//! The report of `ferry calibrate`: the primitives beside Genie's Table 6, the fits, the
//! thresholds, the TCOW-fault bar, and the calibration file's text.

use std::fmt::Write as _;

use ferry::semantics::primitive as p;

use super::{Calibrated, MARGIN};
use crate::harness::output::{bytes, num, PlotSpec, Table};
use crate::harness::BenchCtx;

/// Genie's Table 6 (Micron P166, NetBSD 1.1), as `(a in µs per byte, b in µs)`, for the
/// primitive of ours closest to each of its rows.
const PAPER: &[(&str, &str, f64, f64)] = &[
    (p::COPY_IN, "Copyin", 0.0180, -3.0),
    (p::COPY_OUT, "Copyout", 0.0220, 15.0),
    (
        p::HANDOVER,
        "Base + Reference",
        0.0598 + 0.000363,
        130.0 + 5.0,
    ),
    (p::PROTECT_UFFD, "Read only", 0.000367, 2.0),
    (p::PROTECT_MPROTECT, "Read only", 0.000367, 2.0),
    (p::HIDE, "Invalidate", 0.000373, 2.0),
    (
        p::REINSTATE,
        "Region check, unreference, reinstate, mark in",
        0.000507,
        11.0,
    ),
    (p::SWAP, "Swap", 0.00163, 15.0),
    (p::REGION_CREATE, "Region create", 0.0, 24.0),
    (p::REGION_MAP, "Region map", 0.000474, 6.0),
    (p::WIRE, "Wire", 0.00141, 18.0),
    (p::UNWIRE, "Unwire", 0.000237, 10.0),
];

fn about(name: &str) -> &'static str {
    match name {
        p::COPY_IN => "an fbuf from a path (last read on the other CPU), the bytes copied in (Passing's copy output); the middle of 3 passes seconds apart (thresholds: the cheapest)",
        p::COPY_IN_LOCAL => "the same, the fbuf touched by no other CPU (a system buffer's output converted to copy)",
        p::COPY_OUT => "copy out through a read-only mapping of pages the other CPU just wrote",
        p::HANDOVER => "weak move's hand-over through Passing (send_sys, recv_sys, header read), one way, 2 pinned processes, busy-polling receiver",
        p::PROTECT_UFFD => "emulated copy's output: userfaultfd write-protect through the TCOW engine, bookkeeping included",
        p::UNPROTECT_UFFD => "userfaultfd un-protect",
        p::PROTECT_MPROTECT => "mprotect read-only",
        p::UNPROTECT_MPROTECT => "mprotect read-write",
        p::TCOW_FAULT => "write to protected pages: copy + replace (B = bytes of pages written)",
        p::HIDE => "pages moved out of the mapping, mremap (region hiding)",
        p::REINSTATE => "pages moved back, mremap (reinstate)",
        p::SWAP => "mmap MAP_SHARED|MAP_FIXED of a lot over an app buffer, then read",
        p::MREMAP => "mremap MREMAP_FIXED of a populated range",
        p::REGION_CREATE => "memfd_create + ftruncate",
        p::REGION_MAP => "mmap of a filled memfd, read one word per page",
        p::REGION_UNMAP => "move's output: dropped under a placeholder below 256 KiB, pages moved out (mremap) from there",
        p::WIRE => "share's output: mlock of an application buffer's view through Passing",
        p::UNWIRE => "munlock",
        _ => "",
    }
}

fn us(ns: f64) -> String {
    num(ns / 1000.0)
}

fn threshold(v: usize) -> String {
    match v {
        usize::MAX => "never (always converts)".into(),
        0 => "0 (never converts)".into(),
        v => bytes(v),
    }
}

pub(super) fn markdown(ctx: &BenchCtx, c: &Calibrated) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## calibrate: the cost of each data-passing primitive (Genie, Tables 6 and 7)\n"
    );
    let _ = writeln!(
        md,
        "Each primitive is timed at {} sizes ({}; medians), and a line ns = a·B + b is fitted \
         through the medians by least squares on the relative error (weights 1/y²), so that a \
         4 KiB point counts as much as a 64 MiB one. Where the cost bends (copies slow down \
         several-fold once the data leaves the last-level cache, between 1 and 16 MiB here), \
         one line cannot follow both sides: there the fit is two lines, split where they fit \
         the points best (`a` and `b` show both, and from which size the second applies). The \
         hand-over runs between two processes pinned \
         to CPUs {} and {} over a ferry channel, through `Passing` under weak move (genie's \
         workers; the receiver busy-polls, then inputs and reads the header); every \
         other primitive runs in one process pinned to CPU {}, the TCOW fault's handler thread \
         on the same CPU; `copy_in` and `copy_out` have a thread on the other CPU read each \
         fbuf before it is written again, or write the pages before they are read, as the \
         peer process does. The machine is shared: read the absolute numbers as this run's.\n",
        c.sizes.len(),
        c.trials_note,
        ctx.cpu(0),
        ctx.cpu(1),
        ctx.cpu(0),
    );
    let mut headers: Vec<String> = vec!["primitive".into(), "what".into()];
    headers.extend(c.sizes.iter().map(|&s| format!("{} (µs)", bytes(s))));
    headers.extend(
        [
            "a (ns/B)",
            "b (µs)",
            "r²",
            "paper row",
            "paper a (ns/B)",
            "paper b (µs)",
        ]
        .map(String::from),
    );
    let hs: Vec<&str> = headers.iter().map(String::as_str).collect();
    let mut t = Table::new(&hs);
    for q in &c.prims {
        let mut row = vec![q.name.to_string(), about(q.name).to_string()];
        if q.name == p::TCOW_FAULT {
            // Its sizes are pages written; list them in the size columns that exist.
            for i in 0..c.sizes.len() {
                row.push(q.points.get(i).map_or(String::new(), |pt| {
                    format!("{} pg: {}", pt.size / 4096, us(pt.summary.median))
                }));
            }
        } else {
            for &s in &c.sizes {
                row.push(q.at(s).map_or("—".into(), us));
            }
        }
        match (q.fit, &q.error) {
            (Some(f), _) => match f.above {
                None => {
                    row.push(num(f.a));
                    row.push(us(f.b));
                    row.push(format!("{:.3}", f.r2));
                }
                // Two lines: below the knee / from it on.
                Some(u) => {
                    row.push(format!(
                        "{} / {} from {}",
                        num(f.a),
                        num(u.a),
                        bytes(u.from)
                    ));
                    row.push(format!("{} / {}", us(f.b), us(u.b)));
                    row.push(format!("{:.3}", f.r2));
                }
            },
            (None, Some(e)) => {
                row.push(format!("not measured: {e}"));
                row.push(String::new());
                row.push(String::new());
            }
            (None, None) => row.extend(["—".into(), "—".into(), "—".into()]),
        }
        match PAPER.iter().find(|r| r.0 == q.name) {
            Some(&(_, row_name, a, b)) => {
                row.push(row_name.into());
                row.push(num(a * 1000.0));
                row.push(num(b));
            }
            None => row.extend(["—".into(), String::new(), String::new()]),
        }
        t.row(row);
    }
    md.push_str(&t.render());
    let _ = writeln!(
        md,
        "\nThe paper's B is a datagram length and its base latency includes the ATM network \
         (0.0598 µs per byte, 155 Mbps); ours is a hand-over in memory, so it is nearly flat in B.\n"
    );

    let th = c.calibration.thresholds;
    let _ = writeln!(
        md,
        "Thresholds derived from these fits (the smallest size from which, at every larger \
         size, the emulated form's own costs, the terms of its recipe that converting to copy \
         does not share, are predicted at least {:.0}% below the conversion's own; below it \
         the form converts to copy):\n",
        MARGIN * 100.0
    );
    let mut t = Table::new(&["threshold", "this run", "Genie (P166)"]);
    t.row(vec![
        "emulated copy".into(),
        threshold(th.emulated_copy),
        "1666 B".into(),
    ]);
    t.row(vec![
        "emulated share".into(),
        threshold(th.emulated_share),
        "280 B".into(),
    ]);
    t.row(vec![
        "emulated move".into(),
        threshold(th.emulated_move),
        "—".into(),
    ]);
    t.row(vec![
        "emulated weak move".into(),
        threshold(th.emulated_weak_move),
        "—".into(),
    ]);
    t.row(vec![
        "swap (input, whole pages)".into(),
        if th.swap == usize::MAX {
            "never: copying out is cheaper".into()
        } else {
            bytes(th.swap)
        },
        "2178 B (reverse copyout)".into(),
    ]);
    md.push_str(&t.render());

    match c.tcow {
        Some(b) => {
            let _ = writeln!(
                md,
                "\nTCOW-fault bar (a fault costs at most 2 × (one page copy + one mmap), \
                 same run): one fault {} µs; one 4 KiB copy {} µs + one `mmap(MAP_FIXED)` of a \
                 page with its first read {} µs = {} µs; ratio {:.2} (limit 2.00): **{}**. \
                 Measured floor, same run: a write-protect fault whose handler only removes the \
                 protection (no copy, no mapping) costs {} µs, {} of one page copy + one mmap.\n",
                us(b.fault_ns),
                us(b.page_copy_ns),
                us(b.mmap_ns),
                us(b.page_copy_ns + b.mmap_ns),
                b.ratio(),
                if b.met() { "met" } else { "not met" },
                b.floor_ns.map_or("n/a".into(), us),
                b.floor_ns.map_or("n/a".into(), |f| format!(
                    "{:.2}x",
                    f / (b.page_copy_ns + b.mmap_ns)
                )),
            );
        }
        None => {
            let _ = writeln!(
                md,
                "\nTCOW-fault bar: not judged, a primitive it needs was not measured (see the table).\n"
            );
        }
    }
    let _ = writeln!(
        md,
        "The calibration file `ferry calibrate` writes from these numbers:\n\n```\n{}```\n",
        c.calibration.to_text()
    );
    md
}

pub(super) fn plot(c: &Calibrated) -> PlotSpec {
    let series = c
        .prims
        .iter()
        .filter(|q| !q.points.is_empty())
        .map(|q| {
            (
                q.name.to_string(),
                q.points
                    .iter()
                    .map(|pt| (pt.size as f64, pt.summary.median / 1000.0))
                    .collect(),
            )
        })
        .collect();
    PlotSpec {
        stem: "calibrate".into(),
        title: "Primitive costs against size (Genie Table 6, this machine)".into(),
        x_label: "bytes".into(),
        y_label: "µs (median)".into(),
        series,
        log_x: true,
        log_y: true,
    }
}

/// The calibration file: a header naming the date and machine, then the fits and thresholds.
pub(super) fn file_text(ctx: &BenchCtx, c: &Calibrated) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (y, m, d) = civil_date(secs / 86_400);
    format!(
        "# ferry calibration, written by `ferry calibrate` on {y:04}-{m:02}-{d:02}, {} (kernel {}, {} CPUs){}\n{}",
        ctx.machine.cpu_model,
        ctx.machine.kernel,
        ctx.machine.online_cpus,
        if ctx.quick { ", quick mode" } else { "" },
        c.calibration.to_text()
    )
}

/// The UTC calendar date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_date(days: u64) -> (i64, u32, u32) {
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::civil_date;

    #[test]
    fn dates() {
        assert_eq!(civil_date(0), (1970, 1, 1));
        assert_eq!(civil_date(20_415), (2025, 11, 23));
        assert_eq!(civil_date(11_016), (2000, 2, 29));
    }
}
