//! The report of `ferry-bench vcm`: the latency and bandwidth tables beside the VCM
//! paper's Figures 4 and 5, the syscall counts, what loopback does to `SEND_ZC`, the
//! bars; and the two plots.

use std::fmt::Write as _;

use ferry::uring::Features;

use super::{Measured, Path, BURST, MAX_UDP};
use crate::harness::output::{bytes, num, ratio, PlotSpec, Table};
use crate::harness::stats::{mean, Summary};
use crate::harness::BenchCtx;

/// The paper's minimum one-way latency at 4 B, and its stated slope (SPARCstation 20s,
/// FORE SBA-200 on 140 Mbit/s ATM).
const PAPER_MIN_US: f64 = 65.0;
const PAPER_US_PER_KIB: f64 = 70.0;
const PAPER_WIRE_MBPS: f64 = 140.0 / 8.0;

fn paper_min(size: usize) -> f64 {
    PAPER_MIN_US + PAPER_US_PER_KIB * size as f64 / 1024.0
}

/// The whole report when this kernel cannot run the benchmark.
pub(super) fn skipped(f: &Features) -> String {
    format!(
        "## vcm: skipped\n\nThis kernel lacks io_uring or SQPOLL: {:?}\n",
        f.why_not
    )
}

/// The tables and prose, from what [`super::measure`] found; `memcpy` is this run's
/// memcpy bandwidth in GB/s.
pub(super) fn markdown(ctx: &BenchCtx, m: &Measured, memcpy: f64) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## vcm: one-way latency and sender bandwidth, command vectors vs syscalls (VCM Figures 4 and 5)\n"
    );
    let _ = writeln!(
        md,
        "UDP over loopback (the 64 KiB point is {MAX_UDP} B, the largest UDP payload). The measuring thread \
         is pinned to CPU {c}; the echo peer (a separate process, blocking recv_from/send_to, \
         the same for both paths) and the SQPOLL kernel thread are pinned to CPU {p}. \
         VCM path: one loop REQUEST command (send linked to the receive of the reply) re-activated \
         with each message's length, completion seen by spinning on the status word. \
         Syscall path: blocking send + recv on a connected socket. One-way latency = round trip / 2. \
         (With the SQPOLL thread on the measuring thread's CPU instead, the two time-slice and the \
         median was about 4 ms at every size in the one run that tried it.)\n",
        c = ctx.cpu(0),
        p = ctx.cpu(1)
    );
    let mut t = Table::new(&[
        "size",
        "VCM min µs",
        "VCM avg",
        "VCM median",
        "VCM p99",
        "syscall min µs",
        "syscall avg",
        "syscall median",
        "syscall p99",
        "median ratio syscall/VCM",
        "paper min µs (65 + 70/KiB)",
    ]);
    for (i, &size) in m.sizes.iter().enumerate() {
        let [v, s] = &m.lat[i];
        let (sv, ss) = (Summary::of(&v.us), Summary::of(&s.us));
        t.row(vec![
            bytes(size),
            num(sv.min),
            num(mean(&v.us)),
            num(sv.median),
            num(sv.p99),
            num(ss.min),
            num(mean(&s.us)),
            num(ss.median),
            num(ss.p99),
            ratio(ss.median / sv.median),
            num(paper_min(size)),
        ]);
    }
    md.push_str(&t.render());

    let _ = writeln!(
        md,
        "\nSender bandwidth (paper's method: {BURST} messages per burst, from activation to the last \
         send's completion; max and average over bursts). Physical reference: memcpy {memcpy:.2} GB/s \
         this run (64 MiB copies; a 64 KiB message is copied from cache, so a burst can beat it); \
         the paper's wire was 140 Mbit/s = {PAPER_WIRE_MBPS:.1} MB/s. The sink socket is never read: \
         once its buffer is full the kernel drops what arrives, after the sender's copy.\n"
    );
    let mut t = Table::new(&[
        "size",
        "VCM max MB/s",
        "VCM avg",
        "syscall max MB/s",
        "syscall avg",
        "avg ratio VCM/syscall",
    ]);
    for (i, &size) in m.sizes.iter().enumerate() {
        let [v, s] = &m.bw[i];
        let (sv, ss) = (Summary::of(v), Summary::of(s));
        t.row(vec![
            bytes(size),
            num(sv.max),
            num(mean(v)),
            num(ss.max),
            num(mean(s)),
            ratio(mean(v) / mean(s)),
        ]);
    }
    md.push_str(&t.render());

    let (vs, vm): (u64, u64) = m
        .lat
        .iter()
        .fold((0, 0), |a, l| (a.0 + l[0].syscalls, a.1 + l[0].messages));
    let (ss, sm): (u64, u64) = m
        .lat
        .iter()
        .fold((0, 0), |a, l| (a.0 + l[1].syscalls, a.1 + l[1].messages));
    let vcm_rate = vs as f64 / vm as f64;
    let sys_rate = ss as f64 / sm as f64;
    let bw_rate = m.bw_syscalls.0 as f64 / m.bw_syscalls.1.max(1) as f64;
    let _ = writeln!(
        md,
        "\nSyscalls per message (a message is one datagram sent or received by the measuring side; \
         warm-up excluded): VCM {vcm_rate:.4} ({vs} io_uring_enter in {vm} messages; bursts: {} in {}), \
         syscall path {sys_rate:.2}.\n",
        m.bw_syscalls.0, m.bw_syscalls.1
    );
    if !m.redone.is_empty() {
        let list: Vec<String> = m
            .redone
            .iter()
            .map(|(p, size)| format!("{} at {}", p.label(), bytes(*size)))
            .collect();
        let _ = writeln!(
            md,
            "Trials redone because a datagram was lost (no reply within {:?}; the lost trial's \
             samples are discarded): {}.\n",
            super::LOST_AFTER,
            list.join(", ")
        );
    }
    let (zs, zc, zok) = m.zc;
    let measured = if zok {
        format!(
            "Measured in this run: of {zs} zero-copy sends (SEND_ZC from the registered region, \
             {MAX_UDP} B each) to a loopback socket, the kernel reported {zc} as copied \
             (IORING_NOTIF_USAGE_ZC_COPIED)."
        )
    } else {
        "SEND_ZC is not available here, so the loopback copy could not be measured.".into()
    };
    let _ = writeln!(
        md,
        "{measured} Loopback copies every datagram payload (into an skb on send, out of it on \
         receive) whatever the submission path, so a zero-copy speed-up needs a real NIC; that is \
         a fact of loopback, not a failure. The paper's adapter moved data by DMA straight from \
         application buffers; here the gain measured is the syscall and wake-up cost, not the copy.\n"
    );
    let four = m.sizes.iter().position(|&s| s == 4);
    let mut bars: Vec<(String, String, bool)> = vec![(
        "steady state with SQPOLL: at most 0.01 syscalls per message".into(),
        format!("{vcm_rate:.4} (bursts {bw_rate:.4})"),
        vcm_rate <= 0.01 && bw_rate <= 0.01,
    )];
    if let Some(i) = four {
        let (v, s) = (
            Summary::of(&m.lat[i][0].us).median,
            Summary::of(&m.lat[i][1].us).median,
        );
        bars.push((
            "lower median one-way latency than the syscall path at 4 B".into(),
            format!(
                "VCM {} µs vs syscall {} µs ({})",
                num(v),
                num(s),
                ratio(s / v)
            ),
            v < s,
        ));
    }
    let _ = writeln!(md, "Bars:\n");
    for (what, got, ok) in &bars {
        let _ = writeln!(
            md,
            "- {} {what}: {got}",
            if *ok { "MET" } else { "NOT MET" }
        );
    }
    let _ = writeln!(
        md,
        "\nNumbers come from a shared machine; judge by the ratios.\n"
    );
    md
}

/// Latency (Figure 4) and bandwidth (Figure 5) against message size.
pub(super) fn plots(m: &Measured) -> Vec<PlotSpec> {
    let mut out = Vec::new();
    let kib = |s: usize| s as f64 / 1024.0;
    let mut series = Vec::new();
    for p in [Path::Vcm, Path::Syscall] {
        let pts = m
            .sizes
            .iter()
            .enumerate()
            .map(|(i, &s)| (kib(s), Summary::of(&m.lat[i][p as usize].us).median))
            .collect();
        series.push((format!("{} (median)", p.label()), pts));
    }
    series.push((
        "paper: min latency (65 µs + 70 µs/KiB)".into(),
        m.sizes.iter().map(|&s| (kib(s), paper_min(s))).collect(),
    ));
    out.push(PlotSpec {
        stem: "vcm-latency".into(),
        title: "One-way latency vs message size (cf. VCM Fig. 4)".into(),
        x_label: "KiB of user data".into(),
        y_label: "one-way latency, µs".into(),
        series,
        log_x: true,
        log_y: true,
    });
    let mut series = Vec::new();
    for p in [Path::Vcm, Path::Syscall] {
        let pts = m
            .sizes
            .iter()
            .enumerate()
            .map(|(i, &s)| (kib(s), mean(&m.bw[i][p as usize])))
            .collect();
        series.push((format!("{} (average)", p.label()), pts));
    }
    out.push(PlotSpec {
        stem: "vcm-bandwidth".into(),
        title: "Sender bandwidth, bursts of 10 (cf. VCM Fig. 5)".into(),
        x_label: "KiB of user data".into(),
        y_label: "MB/s".into(),
        series,
        log_x: true,
        log_y: true,
    });
    out
}
