//! The report of `ferry-bench container`: how the five domains ran, a table per size
//! beside the paper's Figure 6, the bars, the floor of a hop; and a plot per size.

use std::fmt::Write as _;

use super::schedule::{
    pallet_layout, resolve, runs, Method, ACCESSES, ACCESSOR, ALL, CHEAP_MSGS, CHEAP_WARMUP, CHUNK,
    DOMAINS, METHODS, PALLETS,
};
use super::{Floor, Measured};
use crate::harness::output::{bytes, num, ratio, PlotSpec, Table};
use crate::harness::stats::spread;
use crate::harness::BenchCtx;

/// Figure 6 of the paper (DECstation 5000/200, Ultrix 4.2a; 10 MB in 5 pallets of 2 MB):
/// (access, method, MB/s) as the text states them; `None` where it gives no number.
const PAPER: &[(usize, [Option<f64>; 3])] = &[
    // container, copy, virtual move
    (0, [Some(15_000.0), Some(3.43), Some(234.0)]),
    (100 << 10, [Some(1_160.0), None, Some(201.0)]),
    (1 << 20, [None, None, None]),
    (ALL, [Some(13.9), Some(2.75), None]),
];

/// What the paper says about each access amount, in words.
fn paper_ratios(access: usize) -> (&'static str, &'static str) {
    match access {
        0 => ("~4,400x", "64x"),
        a if a == 100 << 10 => ("—", "~6x"),
        a if a == 1 << 20 => ("—", "1.57x (57% better)"),
        _ => ("~5x", "—"),
    }
}

fn access_label(a: usize, size: usize) -> String {
    if a >= size {
        format!("all ({})", bytes(size))
    } else if a == 0 {
        "0".into()
    } else {
        bytes(a)
    }
}

/// Bar checks: (description, measured, met).
fn verdicts(measured: &[Measured]) -> Vec<(String, String, bool)> {
    let mut v = Vec::new();
    for m in measured {
        let s = m.run.label();
        let rc = m.ratio(Method::Copy, 0);
        let rv = m.ratio(Method::VirtualMove, 0);
        v.push((
            format!("{s}, 0 B accessed: container >= 1000x copy"),
            ratio(rc),
            rc >= 1000.0,
        ));
        v.push((
            format!("{s}, 0 B accessed: container >= 10x virtual move"),
            ratio(rv),
            rv >= 10.0,
        ));
    }
    for m in measured {
        let r = m.ratio(Method::VirtualMove, 100 << 10);
        v.push((
            format!(
                "{}, 100 KiB accessed: container >= 3x virtual move",
                m.run.label()
            ),
            ratio(r),
            r >= 3.0,
        ));
    }
    let spread = |size: usize| {
        measured
            .iter()
            .find(|m| m.run.size == size && !m.run.one_cpu)
    };
    if let (Some(small), Some(big)) = (spread(10 << 20), spread(1 << 30)) {
        let t = |m: &Measured| {
            m.cell(Method::Container, 0)
                .map_or(f64::NAN, |c| c.median_us())
        };
        let (ts, tb) = (t(small), t(big));
        v.push((
            format!(
                "shipping {} takes <= 2x the time of {} ({PALLETS} pallets each, 0 B accessed)",
                bytes(big.run.size),
                bytes(small.run.size)
            ),
            format!("{} µs vs {} µs = {}", num(tb), num(ts), ratio(tb / ts)),
            tb <= 2.0 * ts,
        ));
    }
    v
}

pub(super) fn markdown(
    ctx: &BenchCtx,
    measured: &[Measured],
    memcpy_gbps: f64,
    floor: &Floor,
) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## container: five-domain pipeline throughput against bytes accessed (container shipping, Figure 6)\n"
    );
    let cpus: Vec<String> = (0..DOMAINS).map(|i| ctx.cpu(i).to_string()).collect();
    let _ = writeln!(
        md,
        "Five domains are five processes in a chain, pinned alternately to CPUs {} (domain 0 to 4); \
         the run marked \"on one CPU\" pins all five to CPU 0, as on the paper's uniprocessor, so each hop \
         is a switch on one CPU rather than a wake-up of the other. \
         The first domain owns the message; domain {ACCESSOR} (the middle) reads and writes the first N bytes \
         of it (each 8-byte word read and written back plus one). Time = transfer + access, from the first \
         domain starting a message to the last domain holding it; one message travels at a time (the last \
         domain sends the container, or a byte, back to the first before the next starts, outside the timing). \
         Throughput = message bytes / median time. The three methods run interleaved in one crew per size:\n",
        cpus.join(", ")
    );
    let _ = writeln!(
        md,
        "- **container shipping**: {PALLETS} memfd pallets shipped with `SCM_RIGHTS` over Unix socket pairs \
         between neighbours (`Container::ship`/`receive`, which checks each memfd); only the accessing domain \
         unloads (maps) the pallets holding its bytes;\n\
         - **physical copy**: each domain `read`s the whole message from a pipe into its own buffer and \
         `write`s it to the next pipe, {} at a time (the pipe capacity), so the domains copy in parallel: the \
         copy's best case;\n\
         - **virtual move**: the same shipping, but every domain, first and last included, unloads every pallet \
         and reads one word per page (maps and populates it) before passing it on.\n",
        bytes(CHUNK)
    );
    let _ = writeln!(
        md,
        "memcpy on this machine, this run: {memcpy_gbps:.2} GB/s (the physical limit a copy approaches).\n"
    );
    for m in measured {
        let size = m.run.size;
        let (per, _) = pallet_layout(size);
        let _ = writeln!(
            md,
            "### {} in {PALLETS} pallets of {} ({} trial{} x {} timed message{} per method and access amount, {} warm-up{}{})\n",
            m.run.label(),
            if per % (1 << 20) == 0 { bytes(per) } else { format!("{} pages", per / 4096) },
            m.run.trials,
            if m.run.trials == 1 { "" } else { "s" },
            m.run.msgs,
            if m.run.msgs == 1 { "" } else { "s" },
            m.run.warmup,
            if m.run.msgs < CHEAP_MSGS || m.run.warmup < CHEAP_WARMUP {
                format!("; container shipping below all accessed: {} messages after {} warm-up", m.run.msgs.max(CHEAP_MSGS), m.run.warmup.max(CHEAP_WARMUP))
            } else {
                String::new()
            },
            if runs(Method::Copy, 100 << 10, size) {
                ""
            } else {
                "; the copy only at 0 and all accessed: it takes seconds, which 100 KiB or 1 MiB of access would change by well under 1%"
            }
        );
        let mut t = Table::new(&[
            "bytes accessed",
            "container MB/s",
            "copy MB/s",
            "virtual move MB/s",
            "container T+A µs",
            "copy T+A µs",
            "virtual move T+A µs",
            "container / copy",
            "container / virtual move",
            "paper: / copy",
            "paper: / virtual move",
            "spread (c, p, v)",
        ]);
        for &a in &ACCESSES {
            let cell = |meth| m.cell(meth, a);
            let us = |meth| cell(meth).map_or(f64::NAN, |c| c.median_us());
            let sp = |meth| {
                cell(meth).map_or("—".to_string(), |c| {
                    format!("{:.0}%", 100.0 * spread(&c.per_trial_us))
                })
            };
            let (pc, pv) = paper_ratios(a);
            t.row(vec![
                access_label(resolve(a, size), size),
                num(m.mbps(Method::Container, a)),
                num(m.mbps(Method::Copy, a)),
                num(m.mbps(Method::VirtualMove, a)),
                num(us(Method::Container)),
                num(us(Method::Copy)),
                num(us(Method::VirtualMove)),
                ratio(m.ratio(Method::Copy, a)),
                ratio(m.ratio(Method::VirtualMove, a)),
                pc.into(),
                pv.into(),
                format!(
                    "{}, {}, {}",
                    sp(Method::Container),
                    sp(Method::Copy),
                    sp(Method::VirtualMove)
                ),
            ]);
        }
        md.push_str(&t.render());
        let _ = writeln!(
            md,
            "\nHarness descriptors: {} open before, {} after (every link end went to exactly one domain; \
             each domain checked at exit that it held no memfd).\n",
            m.fds_before, m.fds_after
        );
    }
    let _ = writeln!(
        md,
        "The paper (DECstation 5000/200, Ultrix 4.2a; 10 MB in 5 pallets of 2 MB; MB/s as its text gives them, \
         — where it gives none):\n"
    );
    let mut t = Table::new(&[
        "bytes accessed",
        "container MB/s",
        "copy MB/s",
        "virtual move MB/s",
        "container / copy",
        "container / virtual move",
    ]);
    for (a, v) in PAPER {
        let cellf = |x: Option<f64>| x.map_or("—".to_string(), num);
        let (pc, pv) = paper_ratios(*a);
        t.row(vec![
            if *a == ALL {
                "all (10 MB)".into()
            } else if *a == 0 {
                "0".into()
            } else {
                bytes(*a)
            },
            cellf(v[0]),
            cellf(v[1]),
            cellf(v[2]),
            pc.into(),
            pv.into(),
        ]);
    }
    md.push_str(&t.render());
    let _ = writeln!(md, "\nBars:\n");
    for (what, got, ok) in verdicts(measured) {
        let _ = writeln!(md, "- {} {what}: {got}", if ok { "MET" } else { "NOT MET" });
    }
    let hops = DOMAINS - 1;
    let _ = writeln!(
        md,
        "\nThe floor of a hop, measured in this run: shipping a 10 MiB container of {PALLETS} pallets \
         and receiving it in one process, with no switch or wake-up, takes {} µs (median; p99 {} µs) \
         and {:.0} system calls through ferry's sys layer (`sendmsg`, `recvmsg` for the header and again for \
         the pallet entries, `fstat` and `F_GET_SEALS` per received memfd) plus the sender's {PALLETS} `close`s: \
         the move model and the receiver's checks need each one. \
         {hops} hops cost at least {} µs, so even with free scheduling container shipping could reach at most:\n",
        num(floor.us.median),
        num(floor.us.p99),
        floor.syscalls,
        num(hops as f64 * floor.us.median)
    );
    for m in measured.iter().filter(|m| m.run.size == 10 << 20) {
        let copy = m.cell(Method::Copy, 0).map_or(f64::NAN, |c| c.median_us());
        let _ = writeln!(
            md,
            "- {}: this run's copy ({} µs) / {} µs = {} over copy",
            m.run.label(),
            num(copy),
            num(hops as f64 * floor.us.median),
            ratio(copy / (hops as f64 * floor.us.median))
        );
    }
    md.push('\n');
    md
}

pub(super) fn plot(m: &Measured) -> PlotSpec {
    let size = m.run.size;
    // Log x cannot show 0: like the paper's graph, the axis is cut and 0 drawn at 1 KiB.
    let x = |a: usize| if a == 0 { 1.0 } else { a as f64 / 1024.0 };
    let series = METHODS
        .iter()
        .map(|&meth| {
            let pts = ACCESSES
                .iter()
                .map(|&a| (x(resolve(a, size)), m.mbps(meth, a)))
                .collect();
            (meth.label().to_string(), pts)
        })
        .collect();
    PlotSpec {
        stem: format!("container-{}", m.run.label().replace(' ', "-")),
        title: format!(
            "{DOMAINS}-domain pipeline, {} in {PALLETS} pallets (cf. container shipping Fig. 6)",
            m.run.label()
        ),
        x_label: "KiB accessed by the middle domain (0 drawn at 1)".into(),
        y_label: "MB/s = bytes / (transfer + access)".into(),
        series,
        log_x: true,
        log_y: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paper_ratios_match_the_text() {
        let at = |a: usize| PAPER.iter().find(|p| p.0 == a).unwrap().1;
        let [c, p, v] = at(0).map(|x| x.unwrap());
        assert!((c / p - 4_400.0).abs() < 100.0);
        assert!((c / v - 64.0).abs() < 1.0);
        let r = at(100 << 10);
        assert!((r[0].unwrap() / r[2].unwrap() - 6.0).abs() < 0.3);
        let r = at(ALL);
        assert!((r[0].unwrap() / r[1].unwrap() - 5.0).abs() < 0.1);
    }
}
