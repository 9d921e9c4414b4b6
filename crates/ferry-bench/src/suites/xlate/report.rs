//! The report of `ferry-bench xlate`: the tables beside the paper's Figures 6 and 7, the
//! notes on `SEND_ZC` over loopback, the bars, and a plot per target and size.

use std::fmt::Write as _;

use super::{Files, Point, Series, Target, FILE_LEN, RATE_MSGS, SERIES, SLOTS, TARGETS, TMPFS_DIR};
use crate::harness::output::{bytes, num, ratio, PlotSpec, Table};
use crate::harness::BenchCtx;

/// What `SEND_ZC` did on TCP loopback: the copies the kernel reported, and each size's
/// median against `WRITE_FIXED` (registered, one buffer) among `points`.
pub(super) fn zc_note_for(zc: &[Point], points: &[Point]) -> String {
    let mut note = String::new();
    let (copied, sends): (u64, u64) = zc
        .iter()
        .fold((0, 0), |(c, s), p| (c + p.stats.zc_copied, s + p.stats.ios));
    let _ = writeln!(
        note,
        "Measured fact, not a failure: on TCP loopback the kernel copies `SEND_ZC` payloads anyway: \
         {copied} of {sends} timed registered `SEND_ZC` sends (one buffer, option `zero_copy_send`) \
         had notifications reporting `IORING_NOTIF_USAGE_ZC_COPIED`. Each such send also waits for \
         its notification, which on loopback arrives once the peer has read the data; median µs per \
         send, `SEND_ZC` against the default `WRITE_FIXED` (registered, 1 buffer):\n"
    );
    let mut tab = Table::new(&["message", "SEND_ZC", "WRITE_FIXED", "ZC_COPIED / sends"]);
    for p in zc {
        let wf = find(points, Target::Socket, p.size, 1, Series::Registered)
            .map_or("—".into(), |w| num(w.lat.median));
        tab.row(vec![
            bytes(p.size),
            num(p.lat.median),
            wf,
            format!("{} / {}", p.stats.zc_copied, p.stats.ios),
        ]);
    }
    note.push_str(&tab.render());
    note
}

/// How much a socket's drain thread read.
pub(super) fn drained_note(target: Target, drained: u64) -> String {
    let mut note = String::new();
    let _ = writeln!(
        note,
        "\nThe {} drain thread read {} in all.",
        target.key(),
        bytes_f(drained)
    );
    note
}

/// One plot per measured target and message size: latency against distinct buffers.
pub(super) fn plots(points: &[Point], sizes: &[usize]) -> Vec<PlotSpec> {
    let mut out = Vec::new();
    for target in TARGETS.into_iter().filter(|&t| measured(points, t)) {
        for &size in sizes {
            let series = SERIES
                .iter()
                .map(|&s| {
                    let pts = points
                        .iter()
                        .filter(|p| p.target == target && p.size == size && p.series == s)
                        .map(|p| (p.buffers as f64, p.lat.median))
                        .collect();
                    (s.label().to_string(), pts)
                })
                .collect();
            out.push(PlotSpec {
                stem: format!("xlate-{}-{}", target.key(), bytes(size).replace(' ', "")),
                title: format!(
                    "{}, {} messages: latency vs distinct buffers ({SLOTS}-slot table; cf. Schoinas & Hill Fig. 7)",
                    target.label(),
                    bytes(size)
                ),
                x_label: "distinct buffers".into(),
                y_label: "median µs per I/O".into(),
                series,
                log_x: true,
                log_y: true,
            });
        }
    }
    out
}

fn send_op_note() -> String {
    if ferry::uring::Features::probe().socket_write_fixed {
        "`WRITE_FIXED` (probed)".into()
    } else {
        "the fallback, since this kernel refused `WRITE_FIXED` on a socket at the probe \
         (`SEND_ZC` if present, else plain `SEND`)"
            .into()
    }
}

fn bytes_f(n: u64) -> String {
    format!("{:.1} MB", n as f64 / 1e6)
}

/// Whether `t` was measured at all (the tmpfs file may be skipped).
fn measured(points: &[Point], t: Target) -> bool {
    points.iter().any(|p| p.target == t)
}

fn find(points: &[Point], t: Target, size: usize, count: usize, s: Series) -> Option<&Point> {
    points
        .iter()
        .find(|p| p.target == t && p.size == size && p.buffers == count && p.series == s)
}

/// The paper's Myrinet results (Figure 6 best case, Figure 7 worst case with the miss
/// rate controlled): latency change of minimal messaging against single copy.
const PAPER: &[(usize, &str, &str)] = &[(512, "-25%", "+9%"), (2048, "-40%", "+2%")];

/// Bar checks: (description, measured, met).
fn verdicts(points: &[Point], sizes: &[usize], counts: &[usize]) -> Vec<(String, String, bool)> {
    let mut v = Vec::new();
    let fits = counts
        .iter()
        .copied()
        .filter(|&c| c <= SLOTS as usize)
        .max();
    for t in TARGETS {
        for &size in sizes {
            if let Some(c) = fits {
                if let (Some(r), Some(e)) = (
                    find(points, t, size, c, Series::Registered),
                    find(points, t, size, c, Series::EveryIo),
                ) {
                    let q = r.mbps / e.mbps;
                    v.push((
                        format!(
                            "{}, {}, {c} buffer(s) (all fit): registered >= 1.2x the throughput of register-every-I/O",
                            t.key(),
                            bytes(size)
                        ),
                        format!("{} vs {} MB/s = {}", num(r.mbps), num(e.mbps), ratio(q)),
                        q >= 1.2,
                    ));
                }
            }
            let far = counts
                .iter()
                .copied()
                .filter(|&c| {
                    c >= 4 * SLOTS as usize
                        && find(points, t, size, c, Series::SingleCopy).is_some()
                })
                .max();
            if let Some(c) = far {
                let (Some(rl), Some(sc), Some(nl)) = (
                    find(points, t, size, c, Series::RateLimited),
                    find(points, t, size, c, Series::SingleCopy),
                    find(points, t, size, c, Series::NoLimit),
                ) else {
                    continue;
                };
                let q = rl.mbps / sc.mbps;
                v.push((
                    format!(
                        "{}, {}, {c} buffers ({}x the table): rate-limited within 10% of single copy",
                        t.key(),
                        bytes(size),
                        c / SLOTS as usize
                    ),
                    format!("{} vs {} MB/s = {}", num(rl.mbps), num(sc.mbps), ratio(q)),
                    q >= 0.9,
                ));
                v.push((
                    format!(
                        "{}, {}, {c} buffers: without the rate limit worse than with it (by 5% or more, beyond noise)",
                        t.key(),
                        bytes(size)
                    ),
                    format!(
                        "{} vs {} MB/s = {}",
                        num(nl.mbps),
                        num(rl.mbps),
                        ratio(nl.mbps / rl.mbps)
                    ),
                    nl.mbps <= 0.95 * rl.mbps,
                ));
            }
        }
    }
    v
}

pub(super) fn markdown(
    ctx: &BenchCtx,
    points: &[Point],
    sizes: &[usize],
    counts: &[usize],
    memcpy_gbps: f64,
    files: &Files,
    zc_note: &str,
) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## xlate: I/O latency and throughput against distinct buffers (Schoinas & Hill, Figures 6 and 7)\n"
    );
    let _ = writeln!(
        md,
        "One thread pinned to CPU {} issues one I/O at a time through an `Xlate` ring (one ring per \
         series; the series take turns in short slices, so noise from the shared machine hits all alike), cycling through N \
         distinct page-aligned buffers (each on its own pages); the cache has {SLOTS} slots (the paper's \
         simulated table), LRU. Throughput is the message size over the median latency (one I/O in flight \
         at a time; the JSON records also hold the mean over the loop). Cycling through more buffers than slots makes every lookup miss. Targets: \
         writes to `/dev/null` (the kernel accepts and drops the data without touching it, so only the \
         host-side cost of each path shows: the analogue of the paper's simulator, whose network was never \
         the bottleneck); {}writes to a {} file in {} opened {} (cycling over {}; on a VM often a virtio disk, \
         whose latency per write dwarfs every host-side cost); sends on a TCP loopback \
         connection; and sends on a Unix stream socket pair (a socket without the TCP stack's per-send cost); \
         each socket drained by a thread busy-polling on CPU {}. Series:\n",
        ctx.cpu(0),
        if files.tmpfs {
            format!("the same O_DIRECT writes to a file on tmpfs in {TMPFS_DIR} (no device: the kernel copies \
                     from the fixed or bounce buffer into the file's pages, so the path's own cost shows); ")
        } else {
            format!("(no O_DIRECT tmpfs file in {TMPFS_DIR} here, so that target is skipped); ")
        },
        files.fs,
        std::env::temp_dir().display(),
        if files.direct { "with O_DIRECT" } else { "WITHOUT O_DIRECT (refused here), so through the page cache" },
        bytes(FILE_LEN as usize),
        ctx.cpu(1)
    );
    let _ = writeln!(
        md,
        "- **registered (cache)**: hit = fixed-buffer I/O from the caller's pages; a miss registers the range \
         first (the paper's CPU miss handling);\n\
         - **single copy**: every I/O copied into a pre-registered bounce buffer;\n\
         - **register every I/O**: `IORING_REGISTER_BUFFERS_UPDATE` of the buffer, then the fixed I/O;\n\
         - **cache + rate limit**: a miss bounces at once; the range is registered while that I/O runs, at \
         most once per {RATE_MSGS} messages' bytes (the paper's hysteresis);\n\
         - **cache, no rate limit**: the same, registering after every miss.\n\
         File I/O is `WRITE_FIXED`; socket I/O is `WRITE_FIXED` on the socket from the registered (or bounce) \
         buffer: one completion, no notification. Plain `IORING_OP_SEND` refuses `IORING_RECVSEND_FIXED_BUF` \
         (Linux 6.18 answers `EINVAL`), and `SEND_ZC` (measured separately below) waits for a notification. \
         Send op here: {}.\n",
        send_op_note()
    );
    let _ = writeln!(
        md,
        "memcpy on this machine, this run: {memcpy_gbps:.2} GB/s (the physical limit of the copy).\n"
    );
    for t in TARGETS.into_iter().filter(|&t| measured(points, t)) {
        for &size in sizes {
            let _ = writeln!(
                md,
                "### {}, {} messages: median µs per I/O (MB/s)\n",
                t.label(),
                bytes(size)
            );
            let mut head = vec!["distinct buffers".to_string()];
            head.extend(SERIES.iter().map(|s| s.label().to_string()));
            head.push("rate-limited: hits / misses / registrations".into());
            let h: Vec<&str> = head.iter().map(String::as_str).collect();
            let mut tab = Table::new(&h);
            for &c in counts {
                if find(points, t, size, c, Series::SingleCopy).is_none() {
                    continue;
                }
                let mut row = vec![c.to_string()];
                for s in SERIES {
                    row.push(find(points, t, size, c, s).map_or("—".into(), |p| {
                        format!("{} ({})", num(p.lat.median), num(p.mbps))
                    }));
                }
                row.push(
                    find(points, t, size, c, Series::RateLimited).map_or("—".into(), |p| {
                        format!(
                            "{} / {} / {}",
                            p.stats.hits, p.stats.misses, p.stats.registrations
                        )
                    }),
                );
                tab.row(row);
            }
            md.push_str(&tab.render());
            md.push('\n');
        }
    }
    if !zc_note.is_empty() {
        md.push_str(zc_note);
        md.push('\n');
    }
    let _ = writeln!(
        md,
        "The paper (Myrinet, 256-entry tables, 2 µs lookup, 100 µs miss with standard kernel interfaces; \
         threshold one miss per 16 KiB) against ours: latency of registered I/O relative to single copy, at \
         1 buffer (best case) and at the most buffers (worst case, rate-limited):\n"
    );
    let far = *counts.last().unwrap_or(&1);
    let mut tab = Table::new(&[
        "message",
        "paper best case",
        "ours best, tmpfs file",
        "ours best, file",
        "ours best, socket",
        "paper worst (rate-limited)",
        "ours worst, tmpfs file",
        "ours worst, file",
        "ours worst, socket",
    ]);
    for &size in sizes {
        let rel = |t: Target, c: usize, s: Series| {
            let c = counts
                .iter()
                .copied()
                .filter(|&k| k <= c && find(points, t, size, k, s).is_some())
                .max()
                .unwrap_or(c);
            match (
                find(points, t, size, c, s),
                find(points, t, size, c, Series::SingleCopy),
            ) {
                (Some(a), Some(b)) => {
                    format!("{:+.0}%", 100.0 * (a.lat.median / b.lat.median - 1.0))
                }
                _ => "—".into(),
            }
        };
        let (pb, pw) = PAPER
            .iter()
            .find(|p| p.0 == size)
            .map_or(("—", "—"), |p| (p.1, p.2));
        tab.row(vec![
            bytes(size),
            pb.into(),
            rel(Target::Tmpfs, 1, Series::Registered),
            rel(Target::File, 1, Series::Registered),
            rel(Target::Socket, 1, Series::Registered),
            pw.into(),
            rel(Target::Tmpfs, far, Series::RateLimited),
            rel(Target::File, far, Series::RateLimited),
            rel(Target::Socket, far, Series::RateLimited),
        ]);
    }
    md.push_str(&tab.render());
    let _ = writeln!(
        md,
        "\nThe paper's simulation: with one miss served per 64 KB, the fallback stays within 10% of single \
         copy; without the rate limit, performance plummets below single copy.\n"
    );
    let _ = writeln!(md, "Bars:\n");
    for (what, got, ok) in verdicts(points, sizes, counts) {
        let _ = writeln!(md, "- {} {what}: {got}", if ok { "MET" } else { "NOT MET" });
    }
    md.push('\n');
    md
}
