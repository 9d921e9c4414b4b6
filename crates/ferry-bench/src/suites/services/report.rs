//! The report of `ferry-bench services`: per placement (near, far), the publish call
//! (median and p99) of ferry's ways (the loan, from the loan's own path and from a path
//! of the other pages, and the general publish) and iceoryx2's, their ratios, the burst time to
//! the last subscriber, the cost per added subscriber beside the cache-line probe, and
//! the bars; the records.

use std::fmt::Write as _;

use super::{
    Measured, Point, System, BAR_BURST, BAR_CALL, BAR_TAIL, BURST, DEPTH, FAR_US, SYSTEMS,
};
use crate::harness::output::{bytes, num, ratio, verdict, BenchOutput, Table};
use crate::harness::record::Record;
use crate::harness::stats::{linear_fit, median, spread, Summary};
use crate::harness::BenchCtx;
use ferry::Pages;

/// Points of one placement.
struct Placement<'a> {
    name: &'static str,
    points: Vec<&'a Point>,
}

impl<'a> Placement<'a> {
    fn at(&self, subs: usize, size: usize, sys: System) -> impl Iterator<Item = &&'a Point> {
        self.points
            .iter()
            .filter(move |p| p.subs == subs && p.size == size && p.sys == sys)
    }

    /// Median over rounds of `f`.
    fn med(&self, subs: usize, size: usize, sys: System, f: fn(&Point) -> f64) -> f64 {
        median(&self.at(subs, size, sys).map(|p| f(p)).collect::<Vec<_>>())
    }

    /// Median over rounds of the per-round ratio `f(sys) / f(iceoryx2)`.
    fn ratio(&self, subs: usize, size: usize, sys: System, f: fn(&Point) -> f64) -> f64 {
        let v: Vec<f64> = self
            .at(subs, size, sys)
            .filter_map(|p| {
                let i = self
                    .at(subs, size, System::Ice)
                    .find(|q| q.round == p.round)?;
                Some(f(p) / f(i))
            })
            .collect();
        median(&v)
    }

    fn floor(&self, subs: Option<usize>) -> f64 {
        let mut v: Vec<(usize, f64)> = self
            .points
            .iter()
            .filter(|p| subs.map_or(true, |n| p.subs == n))
            .map(|p| (p.round, p.floor))
            .collect();
        v.dedup_by_key(|x| x.0);
        median(&v.iter().map(|x| x.1).collect::<Vec<_>>())
    }

    fn rounds(&self, subs: usize) -> usize {
        let mut r: Vec<usize> = self
            .points
            .iter()
            .filter(|p| p.subs == subs)
            .map(|p| p.round)
            .collect();
        r.dedup();
        r.len()
    }

    /// Slope (µs per subscriber) of the round medians of `f` against N.
    fn slope(&self, subs: &[usize], size: usize, sys: System, f: fn(&Point) -> f64) -> f64 {
        let pts: Vec<(f64, f64)> = subs
            .iter()
            .map(|&n| (n as f64, self.med(n, size, sys, f)))
            .filter(|p| p.1.is_finite())
            .collect();
        linear_fit(&pts).map_or(f64::NAN, |f| f.slope)
    }
}

fn call_med(p: &Point) -> f64 {
    p.call.median
}
fn call_p99(p: &Point) -> f64 {
    p.call.p99
}
fn burst(p: &Point) -> f64 {
    p.burst
}
fn fill(p: &Point) -> f64 {
    p.fill
}
fn fill2(p: &Point) -> f64 {
    p.fill2
}
fn fill2_skewed(p: &Point) -> f64 {
    p.fill2_skewed
}
/// What page-aligned payloads cost two fbufs in turn: their fill less that of two fbufs
/// whose payloads start a cache line apart.
fn aligned_price(p: &Point) -> f64 {
    p.fill2 - p.fill2_skewed
}
/// ferry's loan burst over the burst bar (`BAR_BURST` × iceoryx2's burst of the round).
fn over_bar(p: &Point, ice: &Point) -> f64 {
    p.burst - BAR_BURST * ice.burst
}
/// The burst less the round's fill floor: what the messaging adds to the payload's
/// writes.
fn above_fill(p: &Point) -> f64 {
    p.burst - p.fill
}

fn placements(m: &Measured) -> Vec<Placement<'_>> {
    [("near", false), ("far", true)]
        .into_iter()
        .map(|(name, far)| Placement {
            name,
            points: m.points.iter().filter(|p| p.far() == far).collect(),
        })
        .filter(|p| !p.points.is_empty())
        .collect()
}

pub(super) fn output(ctx: &BenchCtx, m: &Measured) -> BenchOutput {
    let mut out = BenchOutput {
        markdown: markdown(ctx, m),
        ..BenchOutput::default()
    };
    for pl in placements(m) {
        for &n in &m.subs {
            for &size in &m.sizes {
                for sys in SYSTEMS {
                    let v: Vec<f64> = pl.at(n, size, sys).map(|p| p.call.median).collect();
                    if v.is_empty() {
                        continue;
                    }
                    let pages = match sys {
                        System::Loan => m.loan_pages.name(),
                        System::LoanAlt => m.alt_pages.name(),
                        System::Publish => Pages::Normal.name(),
                        System::Ice => "",
                    };
                    let rec = |series: &str, unit: &str, s: Summary, sp: f64| {
                        Record::new("services", series, unit, s, v.len() as u32, sp)
                            .param("system", sys.name())
                            .param("pages", pages)
                            .param("subscribers", n)
                            .param("size", size)
                            .param("placement", pl.name)
                    };
                    out.records.push(rec(
                        "publish call, median per round",
                        "us",
                        Summary::of(&v),
                        spread(&v),
                    ));
                    let p99: Vec<f64> = pl.at(n, size, sys).map(|p| p.call.p99).collect();
                    out.records.push(rec(
                        "publish call, p99 per round",
                        "us",
                        Summary::of(&p99),
                        0.0,
                    ));
                    let b: Vec<f64> = pl.at(n, size, sys).map(|p| p.burst).collect();
                    out.records.push(rec(
                        "burst to the last subscriber",
                        "us",
                        Summary::of(&b),
                        spread(&b),
                    ));
                    if sys != System::Ice {
                        let r: Vec<f64> = pl
                            .at(n, size, sys)
                            .filter_map(|p| {
                                let i = pl.at(n, size, System::Ice).find(|q| q.round == p.round)?;
                                Some(p.call.median / i.call.median)
                            })
                            .collect();
                        out.records.push(
                            rec(
                                "publish call / iceoryx2's",
                                "ratio",
                                Summary::of(&r),
                                spread(&r),
                            )
                            .param("bar", BAR_CALL),
                        );
                    }
                }
            }
        }
    }
    out.records.push(
        Record::new(
            "services",
            "publish_evicting",
            "us",
            Summary::of(&m.evict),
            m.evict.len() as u32,
            spread(&m.evict),
        )
        .param("subscribers", 1)
        .param("size", 64),
    );
    out
}

fn markdown(ctx: &BenchCtx, m: &Measured) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "### services: publish-subscribe fan-out, ferry vs iceoryx2 0.10\n\n\
         Publisher on CPU {}, N subscribers of each system in one process on CPU {} \
         (busy-polling only the subscribers of the system whose bursts run, each message's header read and checked, dropped at once); both \
         systems block when a queue is full, queues of {DEPTH}; bursts of {BURST} messages \
         from drained queues, each message written one byte per page. {} rounds per N, \
         {} timed bursts per round, size and system, the systems' order rotated per round. \
         \"ferry loan\": `Publisher::loan`, write, `send`, its fbufs of {} pages; \
         \"ferry loan alt\": the same from a path of {} pages (`Publisher::loan_from`, \
         sizes of {} and up only); \"ferry publish\": `Publisher::publish` of an `IoData` \
         from a path of 4k pages; iceoryx2: `loan_slice_uninit`, write, `send`. At the \
         end the loans' path of thp pages had collapsed {} spans of 2 MiB. The publish call is the send alone, timed with two clock reads \
         whose own cost ({} µs) is taken off. Each round starts with a probe: one cache \
         line bounced between the two processes (half the round trip); rounds above {FAR_US} \
         µs count as \"far\". Ratios are the median over the placement's rounds of the \
         per-round ratio. Load average at the start: {}.\n",
        ctx.cpu(0),
        ctx.cpu(1),
        m.rounds,
        m.bursts,
        m.loan_pages,
        m.alt_pages,
        bytes(ferry::SHARE_HUGE_FROM),
        m.collapsed,
        num(m.clock),
        m.load,
    );
    let subs_fit: &[usize] = &m.subs;
    for pl in placements(m) {
        let _ = writeln!(
            md,
            "#### {} placement (one cache line {} µs, median of its rounds)\n",
            pl.name,
            num(pl.floor(None)),
        );
        let mut t = Table::new(&[
            "N",
            "size",
            "rounds",
            "line",
            "ferry loan median / p99",
            "loan alt median / p99",
            "ferry publish median / p99",
            "iceoryx2 median / p99",
            "loan / ice",
            "publish / ice",
            "loan p99 / ice p99",
            "burst: loan / alt / publish / ice (µs)",
            "burst loan / ice",
            "burst alt / ice",
            "burst publish / ice",
        ]);
        for &n in &m.subs {
            for &size in &m.sizes {
                if pl.at(n, size, System::Ice).next().is_none() {
                    continue;
                }
                let mp = |sys| {
                    format!(
                        "{} / {}",
                        num(pl.med(n, size, sys, call_med)),
                        num(pl.med(n, size, sys, call_p99))
                    )
                };
                t.row(vec![
                    n.to_string(),
                    bytes(size),
                    pl.rounds(n).to_string(),
                    num(pl.floor(Some(n))),
                    mp(System::Loan),
                    mp(System::LoanAlt),
                    mp(System::Publish),
                    mp(System::Ice),
                    ratio(pl.ratio(n, size, System::Loan, call_med)),
                    ratio(pl.ratio(n, size, System::Publish, call_med)),
                    ratio(pl.ratio(n, size, System::Loan, call_p99)),
                    format!(
                        "{} / {} / {} / {}",
                        num(pl.med(n, size, System::Loan, burst)),
                        num(pl.med(n, size, System::LoanAlt, burst)),
                        num(pl.med(n, size, System::Publish, burst)),
                        num(pl.med(n, size, System::Ice, burst))
                    ),
                    ratio(pl.ratio(n, size, System::Loan, burst)),
                    ratio(pl.ratio(n, size, System::LoanAlt, burst)),
                    ratio(pl.ratio(n, size, System::Publish, burst)),
                ]);
            }
        }
        md.push_str(&t.render());
        let mut t = Table::new(&[
            "size",
            "per added subscriber: ferry loan (µs)",
            "ferry publish",
            "iceoryx2",
            "one cache line",
        ]);
        for &size in &m.sizes {
            t.row(vec![
                bytes(size),
                num(pl.slope(subs_fit, size, System::Loan, call_med)),
                num(pl.slope(subs_fit, size, System::Publish, call_med)),
                num(pl.slope(subs_fit, size, System::Ice, call_med)),
                num(pl.floor(None)),
            ]);
        }
        let _ = writeln!(md);
        md.push_str(&t.render());
        let _ = writeln!(md);
        fill_floor(&mut md, m, &pl);
        bars(&mut md, m, &pl);
    }
    let _ = writeln!(
        md,
        "Drop policy, one subscriber stopped with its queue full (every publish evicts the \
         oldest queued message and takes its fbufs back), 64 B: {} µs per publish.\n",
        num(Summary::of(&m.evict).median)
    );
    md
}

/// The fill floor of one placement beside the bursts: what a burst's writes cost alone,
/// the part of iceoryx2's burst it is, ferry's loan and iceoryx2's bursts less it, and
/// what the burst bar leaves ferry per message above it.
fn fill_floor(md: &mut String, m: &Measured, pl: &Placement<'_>) {
    let mut t = Table::new(&[
        "N",
        "size",
        "fill floor: one fbuf / two / two a line apart (µs)",
        "floor / ice burst",
        "burst less floor: loan / ice (µs)",
        "loan / ice, less floor",
        "per message under the bar: room / loan's (µs)",
        "per burst: page-aligned price / loan over the bar (µs)",
    ]);
    for &n in &m.subs {
        for &size in &m.sizes {
            if pl.at(n, size, System::Ice).next().is_none() {
                continue;
            }
            let share: Vec<f64> = pl
                .at(n, size, System::Ice)
                .map(|p| p.fill / p.burst)
                .collect();
            let ice = pl.med(n, size, System::Ice, burst);
            let floor = pl.med(n, size, System::Ice, fill);
            let over: Vec<f64> = pl
                .at(n, size, System::Loan)
                .filter_map(|p| {
                    let i = pl.at(n, size, System::Ice).find(|q| q.round == p.round)?;
                    Some(over_bar(p, i))
                })
                .collect();
            t.row(vec![
                n.to_string(),
                bytes(size),
                format!(
                    "{} / {} / {}",
                    num(floor),
                    num(pl.med(n, size, System::Ice, fill2)),
                    num(pl.med(n, size, System::Ice, fill2_skewed))
                ),
                ratio(median(&share)),
                format!(
                    "{} / {}",
                    num(pl.med(n, size, System::Loan, above_fill)),
                    num(pl.med(n, size, System::Ice, above_fill))
                ),
                ratio(pl.ratio(n, size, System::Loan, above_fill)),
                format!(
                    "{} / {}",
                    num((BAR_BURST * ice - floor) / BURST as f64),
                    num(pl.med(n, size, System::Loan, above_fill) / BURST as f64)
                ),
                format!(
                    "{} / {}",
                    num(pl.med(n, size, System::Ice, aligned_price)),
                    num(median(&over))
                ),
            ]);
        }
    }
    let _ = writeln!(
        md,
        "Fill floor ({} placement): a burst's writes alone, each round at each size: {BURST} \
         fills (one byte per page and the header) of one fbuf of the loans' path (two in \
         turn, the second figure), each followed by a SeqCst fence and timed alone (an \
         untimed pause between two, as messaging spaces them), no messaging. Both systems \
         pay it: each system's send waits for the fill's stores at its first locked \
         instruction. The ratios use the one-fbuf floor, the lower. \"Room\" is what the \
         burst bar ({BAR_BURST}x iceoryx2's burst) leaves per message above the floor; \
         \"loan's\" is what ferry's loan adds per message above it now. The third floor \
         fills two fbufs in turn whose payloads start a cache line apart (the second 64 \
         bytes into a larger span), as iceoryx2's chunks (a payload and a 48-byte header \
         apart) do: in two page-aligned fbufs, the bytes a fill writes in each page fall \
         in the same cache sets. \"Page-aligned price\" is the two-fbuf floor less that \
         one: what ferry's page-aligned payloads cost a burst whose loans take two fbufs \
         in turn, the most a payload layout could save it (ferry's loan takes the fbuf \
         released last, mostly one, by collecting every subscriber's releases first). \
         \"Loan over the bar\" is ferry's loan burst less {BAR_BURST}x iceoryx2's \
         (negative: under the bar); where it is larger than the price, no payload layout \
         alone brings the burst under the bar.\n",
        pl.name
    );
    md.push_str(&t.render());
    let _ = writeln!(md);
}

/// The bars of one placement, for each of ferry's two ways (and the loan from a path of
/// the other pages, at the sizes it runs).
fn bars(md: &mut String, m: &Measured, pl: &Placement<'_>) {
    for sys in [System::Loan, System::LoanAlt, System::Publish] {
        let mut worst_call = f64::NAN;
        let mut worst_burst = f64::NAN;
        let mut worst_tail = f64::NAN;
        let max = |a: f64, b: f64| if a.is_nan() || b > a { b } else { a };
        for &n in &m.subs {
            for &size in &m.sizes {
                if pl.at(n, size, sys).next().is_none() {
                    continue;
                }
                worst_call = max(worst_call, pl.ratio(n, size, sys, call_med));
                worst_burst = max(worst_burst, pl.ratio(n, size, sys, burst));
                worst_tail = max(
                    worst_tail,
                    pl.med(n, size, sys, call_p99) / pl.med(n, size, sys, call_med),
                );
            }
        }
        let mut worst_slope = f64::NAN;
        for &size in &m.sizes {
            let f = pl.slope(&m.subs, size, sys, call_med);
            let i = pl.slope(&m.subs, size, System::Ice, call_med);
            worst_slope = max(worst_slope, f - i);
        }
        let _ = writeln!(
            md,
            "- {} ({}, {}): publish call ≤ {BAR_CALL}x iceoryx2's: worst {} — **{}**; per added \
             subscriber ≤ iceoryx2's: worst excess {} µs — **{}**; burst to the last \
             subscriber ≤ {BAR_BURST}x: worst {} — **{}**; p99 ≤ {BAR_TAIL}x median: worst {} — **{}**.",
            sys.name(),
            match sys {
                System::Loan => m.loan_pages.name(),
                System::LoanAlt => m.alt_pages.name(),
                _ => Pages::Normal.name(),
            },
            pl.name,
            ratio(worst_call),
            verdict(worst_call <= BAR_CALL),
            num(worst_slope),
            verdict(worst_slope <= 0.0),
            ratio(worst_burst),
            verdict(worst_burst <= BAR_BURST),
            ratio(worst_tail),
            verdict(worst_tail <= BAR_TAIL),
        );
    }
    let _ = writeln!(md);
}
