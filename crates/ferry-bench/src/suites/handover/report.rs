//! The report of `ferry-bench handover`: one table with the floors (one line, two lines,
//! page writes then two lines), ferry and iceoryx2 side by side, the per-round ratios and
//! the bars; the records; and the plot.

use std::fmt::Write as _;

use super::{summary, AtSize, Measured, BAR_FLOOR, BAR_ICE};
use crate::harness::output::{bytes, num, ratio, verdict, BenchOutput, PlotSpec, Table};
use crate::harness::record::Record;
use crate::harness::stats::spread;
use crate::harness::BenchCtx;

pub(super) fn output(ctx: &BenchCtx, m: &Measured) -> BenchOutput {
    let mut out = BenchOutput {
        markdown: markdown(ctx, m),
        ..BenchOutput::default()
    };
    for a in &m.sizes {
        let series: [(&str, &str, &[f64]); 10] = [
            (
                "floor",
                "one-way (half round trip of one cache line)",
                &a.floor,
            ),
            ("floor", "one-way by stamps", &a.floor_stamped),
            (
                "two-line floor",
                "one-way (half round trip: descriptor line, then header line)",
                &a.floor2,
            ),
            ("two-line floor", "one-way by stamps", &a.floor2_stamped),
            (
                "page-writes floor",
                "one-way (half round trip: one byte per page written, then header line and descriptor line)",
                &a.floorp,
            ),
            ("page-writes floor", "one-way by stamps", &a.floorp_stamped),
            ("ferry", "one-way", &a.ferry),
            ("ferry", "send call", &a.ferry_call),
            ("iceoryx2", "one-way", &a.ice),
            ("iceoryx2", "send call", &a.ice_call),
        ];
        for (system, what, v) in series {
            if v.is_empty() {
                continue;
            }
            out.records.push(
                Record::new(
                    "handover",
                    &format!("{system}, {what}"),
                    "µs",
                    summary(v),
                    m.rounds,
                    0.0,
                )
                .param("system", system)
                .param("measure", what)
                .param("bytes", a.size)
                .param("wait", "busy-poll")
                .param(
                    "touch",
                    "one byte per page written; the receiver reads the header",
                ),
            );
        }
        for (what, v, bar) in [
            (
                "ferry/iceoryx2, median of per-round ratios",
                &a.ratio_ice,
                BAR_ICE,
            ),
            (
                "ferry/floor, median of per-round ratios",
                &a.ratio_floor,
                BAR_FLOOR,
            ),
        ] {
            if v.is_empty() {
                continue;
            }
            out.records.push(
                Record::new("handover", what, "ratio", summary(v), m.rounds, spread(v))
                    .param("bytes", a.size)
                    .param("bar", bar)
                    .param("met", summary(v).median <= bar),
            );
        }
        let v = &a.ratio_floorp;
        if !v.is_empty() {
            out.records.push(
                Record::new(
                    "handover",
                    "ferry/page-writes floor by stamps, median of per-round ratios",
                    "ratio",
                    summary(v),
                    m.rounds,
                    spread(v),
                )
                .param("bytes", a.size),
            );
        }
    }
    out.plots.push(plot(m));
    out
}

fn markdown(ctx: &BenchCtx, m: &Measured) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## handover: one-way hand-over, ferry vs iceoryx2 0.10 vs the cache-line floor\n"
    );
    let _ = writeln!(
        md,
        "Sender on CPU {}, receiver on CPU {}, both busy-polling; {} interleaved rounds (each round runs \
         every size and every system, the systems' order rotated per round), {} timed messages per \
         system, size and round. Protocol, the same for all: the sender writes one byte in every page, \
         stamps CLOCK_MONOTONIC into the header and hands over (ferry: a cached fbuf loaned to the sender \
         before the writes (`Sender::loan`: ring place found and descriptor stored there, unpublished), \
         written through `Loan::as_mut_slice`, then `Loan::send`; iceoryx2: send of a \
         loaned `[u8]` slice, ipc service, power-of-two dynamic segment); the \
         receiver reads the header, stamps, drops the message and acknowledges through a shared cache \
         line. Floor: one cache line bounced between the two processes, half the round trip. \
         Page-writes floor: the sender writes one byte in every page of a private buffer of the \
         payload's size, stamps, and does the 2-line floor's hand-over. µs, \
         median and p99 over every message; ratios are the median over rounds of the per-round median \
         ratio.\n",
        ctx.cpu(0),
        ctx.cpu(1),
        m.rounds,
        m.msgs
            .iter()
            .zip(&m.sizes)
            .map(|(n, a)| format!("{n} at {}", bytes(a.size)))
            .collect::<Vec<_>>()
            .join(", "),
    );
    if super::stamp::settling() {
        let _ = writeln!(
            md,
            "**Diagnostic protocol ({} set):** both senders issue a SeqCst fence after writing the \
             pages and before the stamp, so the payload's stores are complete when the timed \
             hand-over starts. Not the protocol the bars are set on.\n",
            super::stamp::SETTLE_VAR
        );
    }
    if super::worker::plain_try_send() {
        let _ = writeln!(
            md,
            "**Diagnostic protocol ({} set):** ferry's sender loans nothing before the \
             writes and hands over with freeze + `try_send`.\n",
            super::worker::TRY_SEND_VAR
        );
    }
    if let Err(why) = &m.ice {
        let _ = writeln!(
            md,
            "**iceoryx2 could not run here, so only ferry and the floor were measured:** {why}\n"
        );
    }
    let mut t = Table::new(&[
        "size",
        "floor median",
        "floor p99",
        "floor by stamps",
        "2-line floor by stamps",
        "page-writes floor by stamps",
        "ferry median",
        "ferry p99",
        "ferry send call",
        "iceoryx2 median",
        "iceoryx2 p99",
        "iceoryx2 send call",
        "ferry/iceoryx2",
        "ferry/floor",
        "ferry/page floor",
    ]);
    for a in &m.sizes {
        let (fl, fs, f2, fp, f, fc, i, ic) = (
            summary(&a.floor),
            summary(&a.floor_stamped),
            summary(&a.floor2_stamped),
            summary(&a.floorp_stamped),
            summary(&a.ferry),
            summary(&a.ferry_call),
            summary(&a.ice),
            summary(&a.ice_call),
        );
        t.row(vec![
            bytes(a.size),
            num(fl.median),
            num(fl.p99),
            num(fs.median),
            num(f2.median),
            num(fp.median),
            num(f.median),
            num(f.p99),
            num(fc.median),
            num(i.median),
            num(i.p99),
            num(ic.median),
            ratio(a.ratio_ice()),
            ratio(a.ratio_floor()),
            ratio(a.ratio_floorp()),
        ]);
    }
    md.push_str(&t.render());
    let worst = |f: &dyn Fn(&AtSize) -> f64| {
        m.sizes.iter().map(f).fold(
            f64::NAN,
            |a: f64, b| if a.is_nan() || b > a { b } else { a },
        )
    };
    let _ = writeln!(md);
    if m.ice.is_ok() {
        let w = worst(&|a| a.ratio_ice());
        let _ = writeln!(
            md,
            "- Bar: ferry at most {BAR_ICE}x iceoryx2 at every size: worst {} — **{}**.",
            ratio(w),
            verdict(w <= BAR_ICE)
        );
    }
    let w = worst(&|a| a.ratio_floor());
    let _ = writeln!(
        md,
        "- Bar: ferry within {BAR_FLOOR}x of the cache-line floor at every size: worst {} — **{}**.",
        ratio(w),
        verdict(w <= BAR_FLOOR)
    );
    let w = worst(&|a| a.ratio_floorp());
    let _ = writeln!(
        md,
        "- Page-writes floor: ferry within {} of a hand-over that does the protocol's page writes \
         and then two line stores (worst over sizes; by stamps, median over rounds of the per-round \
         median ratio). Not a bar: it shows how much of ferry's cost at 16 and 64 MiB is the page \
         writes still draining from the store buffer when the hand-over's stores run (under x86 TSO \
         the descriptor store cannot become visible before them).",
        ratio(w)
    );
    let _ = writeln!(
        md,
        "- \"send call\" is the sender's time from the stamp to the return of the send (ferry: \
         `Loan::send`; iceoryx2: assume_init and send). The floor by stamps is the one-line hand-over \
         timed like the systems (stamp, store / load, stamp): the clock reads are in it. The 2-line \
         floor is meant as what any descriptor hand-over pays when its receiver reads the payload's \
         header (though in the far vCPU placement ferry's one-page hand-over has measured below it, \
         for reasons not found): \
         the sender writes a header line (taken back from the receiver, which read it last time, \
         before the stamp, as ferry's loan does with `prefetchw`) and then a descriptor line naming \
         it, the receiver polls \
         the descriptor line and then reads the header line where the descriptor says, two cache \
         lines crossing one after the other (the header's address depends on the descriptor, as \
         ferry's and iceoryx2's do; a header read from a fixed place would overlap the two \
         transfers). The page-writes floor is the 2-line floor after the same page writes as ferry and \
         iceoryx2 (into a pre-faulted private buffer of ferry's fbuf size), stamped after them like \
         the systems.\n"
    );
    md
}

/// Which samples of a size a plot series shows.
type Column = fn(&AtSize) -> &[f64];

fn plot(m: &Measured) -> PlotSpec {
    fn ferry(a: &AtSize) -> &[f64] {
        &a.ferry
    }
    fn ice(a: &AtSize) -> &[f64] {
        &a.ice
    }
    fn floor(a: &AtSize) -> &[f64] {
        &a.floor
    }
    fn floorp(a: &AtSize) -> &[f64] {
        &a.floorp
    }
    let pts = |f: Column, p99: bool| -> Vec<(f64, f64)> {
        m.sizes
            .iter()
            .filter(|a| !f(a).is_empty())
            .map(|a| {
                let s = summary(f(a));
                (a.size as f64, if p99 { s.p99 } else { s.median })
            })
            .collect()
    };
    let mut series = Vec::new();
    let all: [(&str, Column); 4] = [
        ("ferry", ferry),
        ("iceoryx2", ice),
        ("cache-line floor", floor),
        ("page-writes floor", floorp),
    ];
    for (name, f) in all {
        let med = pts(f, false);
        if med.is_empty() {
            continue;
        }
        series.push((format!("{name} (median)"), med));
        series.push((format!("{name} (p99)"), pts(f, true)));
    }
    PlotSpec {
        stem: "handover".into(),
        title: "One-way hand-over between two pinned processes".into(),
        x_label: "message size (bytes)".into(),
        y_label: "µs".into(),
        series,
        log_x: true,
        log_y: true,
    }
}
