//! The report of the one-way latency part of `ferry-bench fbufs-path`: the latency table,
//! copy against hand-over, every byte read against memcpy, the hand-over alone and the
//! bars; and the plot.

use std::fmt::Write as _;

use super::{wait_label, Curve, FERRY, RATIO_AT, TRANSPORTS, WAITS};
use crate::harness::output::{bytes, num, ratio, PlotSpec, Table};
use crate::harness::BenchCtx;
use crate::protocol::{Touch, Wait};
use crate::transport::TransportKind;

pub(super) fn markdown(ctx: &BenchCtx, all: &[Curve], sizes: &[usize], trials: u32) -> String {
    let curves: Vec<&Curve> = all.iter().filter(|c| c.touch == Touch::Word).collect();
    let curves = &curves[..];
    let mut md = String::new();
    let _ = writeln!(md, "### One-way hand-over latency\n");
    let _ = writeln!(
        md,
        "Sender on CPU {}, receiver on CPU {}. The sender stamps CLOCK_MONOTONIC into the message just \
         before handing it over; the receiver takes the difference once it holds the whole message, \
         then acknowledges, so messages never queue. µs, median and 99th percentile over all messages \
         of {trials} trials; \"trials\" is the range of the per-trial medians.\n",
        ctx.cpu(0),
        ctx.cpu(1)
    );
    let mut headers = vec!["size".to_string()];
    for c in curves {
        headers.push(format!("{} median", c.label()));
        headers.push("p99".into());
        headers.push("trials".into());
    }
    let both = |k| {
        let spin = curves
            .iter()
            .find(|c| c.kind == k && c.wait == Wait::Spin)?;
        let block = curves
            .iter()
            .find(|c| c.kind == k && c.wait == Wait::Block)?;
        Some((spin, block))
    };
    let pairs: Vec<_> = TRANSPORTS.iter().filter_map(|&k| both(k)).collect();
    for (spin, _) in &pairs {
        headers.push(format!("{}: blocking / busy-poll", spin.kind.label()));
    }
    let mut t = Table::new(&headers);
    for (i, &size) in sizes.iter().enumerate() {
        let mut row = vec![bytes(size)];
        for c in curves {
            let p = &c.points[i];
            let lo = p.per_trial.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = p
                .per_trial
                .iter()
                .copied()
                .fold(f64::NEG_INFINITY, f64::max);
            row.push(num(p.summary.median));
            row.push(num(p.summary.p99));
            row.push(format!("{}–{}", num(lo), num(hi)));
        }
        for (spin, block) in &pairs {
            row.push(ratio(
                block.points[i].summary.median / spin.points[i].summary.median,
            ));
        }
        t.row(row);
    }
    md.push_str(&t.render());
    md.push('\n');
    md.push_str(&ratios(curves, sizes));
    md.push_str(&every_byte(ctx, all, sizes));
    md.push_str(&header_only(all, sizes));
    md
}

/// ferry's hand-over alone: the receiver reads only the header.
fn header_only(all: &[Curve], sizes: &[usize]) -> String {
    let curves: Vec<&Curve> = all.iter().filter(|c| c.touch == Touch::Header).collect();
    if curves.is_empty() {
        return String::new();
    }
    let mut md = String::from(
        "The hand-over alone: the receiver reads only the 24-byte header, not one word per page \
         (µs, median and p99):\n\n",
    );
    let mut headers = vec!["size".to_string()];
    for c in &curves {
        headers.push(format!("{} median", c.label()));
        headers.push("p99".into());
    }
    let mut t = Table::new(&headers);
    for (i, &size) in sizes.iter().enumerate() {
        t.row(median_p99_row(size, i, &curves));
    }
    md.push_str(&t.render());
    let mut t = Table::new(&[
        "curve",
        "largest / smallest median",
        "syscalls/msg (sender, receiver)",
    ]);
    for c in &curves {
        let meds: Vec<f64> = c.points.iter().map(|p| p.summary.median).collect();
        let lo = meds.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = meds.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        t.row(vec![c.label(), ratio(hi / lo), sys_cell(c)]);
    }
    md.push('\n');
    md.push_str(&t.render());
    md.push('\n');
    md.push_str(&bars(all, &curves));
    md
}

/// The bars, judged on the hand-over alone: moving a buffer through a
/// pipe (write plus read) against handing it over, and a busy-poll median of at most
/// 1 µs at every size.
fn bars(all: &[Curve], header: &[&Curve]) -> String {
    let pipe = all
        .iter()
        .find(|c| c.kind == TransportKind::Pipe && c.wait == Wait::Spin && c.touch == Touch::Word);
    let Some(spin) = header.iter().find(|c| c.wait == Wait::Spin) else {
        return String::new();
    };
    let verdict = |ok: bool| if ok { "met" } else { "not met" };
    let mut t = Table::new(&["bar", "measured", "verdict"]);
    if let Some(pipe) = pipe {
        for (s, want) in [(1usize << 20, 100.0), (64 << 20, 1000.0)] {
            if let (Some(a), Some(b)) = (median_at(pipe, s), median_at(spin, s)) {
                t.row(vec![
                    format!(
                        "pipe (busy-poll) / ferry hand-over at {} ≥ {want}x",
                        bytes(s)
                    ),
                    ratio(a / b),
                    verdict(a / b >= want).into(),
                ]);
            }
        }
    }
    let worst = spin
        .points
        .iter()
        .map(|p| p.summary.median)
        .fold(f64::NEG_INFINITY, f64::max);
    t.row(vec![
        "ferry busy-poll hand-over median ≤ 1 µs at every size".into(),
        format!("{} µs (largest median)", num(worst)),
        verdict(worst <= 1.0).into(),
    ]);
    format!(
        "The bars on the hand-over (one run; medians move by tens of percent between \
         runs on this shared VM):\n\n{}\n",
        t.render()
    )
}

/// The median of `c` at `size`.
/// A row's first cells: the size, then each curve's median and p99 at its point `i`.
fn median_p99_row(size: usize, i: usize, curves: &[&Curve]) -> Vec<String> {
    let mut row = vec![bytes(size)];
    for c in curves {
        row.push(num(c.points[i].summary.median));
        row.push(num(c.points[i].summary.p99));
    }
    row
}

fn median_at(c: &Curve, size: usize) -> Option<f64> {
    c.points
        .iter()
        .find(|p| p.size == size)
        .map(|p| p.summary.median)
}

fn sys_cell(c: &Curve) -> String {
    match c.syscalls {
        (Some(a), Some(b)) => format!("{}, {}", num(a), num(b)),
        _ => "—".into(),
    }
}

/// pipe median / ferry median at the sizes the bars name, and how flat ferry's curve is.
fn ratios(curves: &[&Curve], sizes: &[usize]) -> String {
    let mut md = String::new();
    let find = |k: TransportKind, w: Wait| curves.iter().find(|c| c.kind == k && c.wait == w);
    let mut headers = vec!["wait".to_string()];
    for &s in RATIO_AT {
        headers.push(format!("pipe / ferry median at {}", bytes(s)));
    }
    headers.extend([
        "ferry median, smallest – largest over sizes (µs)".to_string(),
        "ferry largest / smallest median".to_string(),
        "ferry syscalls/msg (sender, receiver)".to_string(),
    ]);
    let mut t = Table::new(&headers);
    for &wait in WAITS {
        let (Some(pipe), Some(f)) = (find(TransportKind::Pipe, wait), find(FERRY, wait)) else {
            continue;
        };
        let mut row = vec![wait_label(wait).to_string()];
        for &s in RATIO_AT {
            row.push(match (median_at(pipe, s), median_at(f, s)) {
                (Some(a), Some(b)) => ratio(a / b),
                _ => "not measured".into(),
            });
        }
        let meds: Vec<f64> = sizes.iter().filter_map(|&s| median_at(f, s)).collect();
        let lo = meds.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = meds.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        row.push(format!("{} – {}", num(lo), num(hi)));
        row.push(ratio(hi / lo));
        row.push(sys_cell(f));
        t.row(row);
    }
    let _ = writeln!(
        md,
        "Copy against hand-over (the receiver reads one word per page). ferry's syscalls are those \
         its own layer made per message in the timed loop (its counter; the acknowledgement pipe is \
         not ferry's and is not counted):\n"
    );
    md.push_str(&t.render());
    md.push('\n');
    md
}

/// The receiver reads every byte: the memcpy time of the same size is the physical limit.
fn every_byte(ctx: &BenchCtx, all: &[Curve], sizes: &[usize]) -> String {
    let curves: Vec<&Curve> = all.iter().filter(|c| c.touch == Touch::All).collect();
    if curves.is_empty() {
        return String::new();
    }
    let gbps = ctx.memcpy_if_measured().map_or(f64::NAN, |m| m.gbps.median);
    let mut md = String::new();
    let _ = writeln!(
        md,
        "One-way latency when the receiver reads every byte (busy-poll; µs, median). The memcpy \
         column is the time to copy the same bytes at this run's memcpy bandwidth ({} GB/s), the \
         physical reference for touching them all:\n",
        num(gbps)
    );
    let mut headers = vec!["size".to_string()];
    for c in &curves {
        headers.push(format!("{} median", c.kind.label()));
        headers.push("p99".into());
    }
    headers.push("memcpy of the size".into());
    for c in &curves {
        headers.push(format!("{} / memcpy", c.kind.label()));
    }
    let mut t = Table::new(&headers);
    for (i, &size) in sizes.iter().enumerate() {
        let mut row = median_p99_row(size, i, &curves);
        let limit = size as f64 / gbps / 1000.0;
        row.push(num(limit));
        for c in &curves {
            row.push(ratio(c.points[i].summary.median / limit));
        }
        t.row(row);
    }
    md.push_str(&t.render());
    md.push('\n');
    md
}

pub(super) fn plot(curves: &[Curve]) -> PlotSpec {
    let mut series = Vec::new();
    for c in curves {
        let med = c
            .points
            .iter()
            .map(|p| (p.size as f64, p.summary.median))
            .collect();
        let p99 = c
            .points
            .iter()
            .map(|p| (p.size as f64, p.summary.p99))
            .collect();
        series.push((format!("{} (median)", c.label()), med));
        series.push((format!("{} (p99)", c.label()), p99));
    }
    PlotSpec {
        stem: "fbufs-path-latency".into(),
        title: "One-way hand-over latency between two pinned processes".into(),
        x_label: "message size (bytes)".into(),
        y_label: "µs".into(),
        series,
        log_x: true,
        log_y: true,
    }
}
