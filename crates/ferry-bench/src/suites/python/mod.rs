//! `ferry-bench python`: handing numpy arrays (a 1080p RGB frame, 6 MB, and 64 MiB) from
//! one Python process to another, through ferry's Python package against
//! `multiprocessing.Queue` (pickling), `multiprocessing.shared_memory` with a queue of
//! segment names and, when its package is installed (`test.sh` installs 0.10.0),
//! iceoryx2. Median and p99 one-way latency, with the consumer holding the array and
//! with it also reading every byte (a sum); and the binding's own cost, a small
//! publish-receive round trip in Python against the same loop in Rust.
//!
//! The measuring is Python (`crates/ferry-py/bench/handover.py`, run with the venv that
//! `crates/ferry-py/test.sh` builds, or `$FERRY_PYTHON`); this suite runs it and turns
//! its JSON into records, a table, one line per bar (the measured ratio, the
//! bar, met or not met) and a plot. The script times in interleaved rounds (every system
//! once a round, the order rotated) after warming every system up. Without an interpreter
//! that imports `ferry` and `numpy` the suite is skipped with the reason printed;
//! iceoryx2 and `torch.multiprocessing` are measured when importable, and the report says
//! why when not.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::harness::ctx::BenchCtx;
use crate::harness::output::{bytes, num, ratio, verdict, BenchOutput, PlotSpec, Table};
use crate::harness::record::Record;
use crate::harness::stats::Summary;
use crate::harness::BenchDef;

pub const BENCH: BenchDef = BenchDef {
    name: "python",
    about: "Python: numpy arrays (6 MB, 64 MiB) between processes via ferry, multiprocessing.Queue, shared_memory and iceoryx2",
    run,
};

/// The repository root, where the script and the default venv are.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The interpreter to use, or why there is none.
fn python() -> Result<PathBuf, String> {
    let py = std::env::var_os("FERRY_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/py-venv/bin/python"));
    let ok = Command::new(&py)
        .args(["-c", "import ferry, numpy"])
        .output()
        .map_err(|e| format!("{}: {e}", py.display()))?;
    if !ok.status.success() {
        return Err(format!(
            "{} cannot import ferry and numpy ({}); build the package with crates/ferry-py/test.sh",
            py.display(),
            String::from_utf8_lossy(&ok.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ));
    }
    Ok(py)
}

fn run(ctx: &BenchCtx) -> Result<BenchOutput> {
    let mut out = BenchOutput::default();
    let py = match python() {
        Ok(p) => p,
        Err(why) => {
            println!("python: skipped: {why}");
            out.markdown = format!("## python: skipped\n\n{why}\n");
            return Ok(out);
        }
    };
    ctx.progress
        .phase("python: numpy arrays between two Python processes");
    let mut cmd = Command::new(&py);
    cmd.arg(root().join("crates/ferry-py/bench/handover.py"));
    if ctx.quick {
        cmd.arg("--quick");
    }
    let res = cmd.output().context("running handover.py")?;
    if !res.status.success() {
        bail!(
            "handover.py failed: {}",
            String::from_utf8_lossy(&res.stderr)
        );
    }
    let v: Value = serde_json::from_slice(&res.stdout).context("handover.py's JSON")?;
    let mut rows: Vec<Row> = Vec::new();
    for r in v["results"].as_array().context("no results")? {
        let us: Vec<f64> = r["us"]
            .as_array()
            .context("no samples")?
            .iter()
            .filter_map(Value::as_f64)
            .collect();
        let s = Summary::of(&us);
        let transport = r["transport"].as_str().unwrap_or("?").to_string();
        let series = r["series"].as_str().unwrap_or("?").to_string();
        let size = r["size"].as_u64().unwrap_or(0);
        out.records.push(
            Record::new("python", &format!("{transport} {series}"), "us", s, 1, 0.0)
                .param("size", size)
                .param("transport", transport.clone())
                .param("messages", us.len()),
        );
        rows.push((transport, size, series, s));
    }
    out.markdown = markdown(&rows, &v["skipped"], v["python"].as_str().unwrap_or("?"));
    let _ = writeln!(
        out.markdown,
        "\n{} interleaved rounds.\n",
        v["rounds"].as_u64().unwrap_or(0)
    );
    for line in bars(&rows) {
        say(&mut out.markdown, &line);
    }
    out.plots.push(plot(&rows));

    // The floor under a sleeping consumer whose producer first writes the array, at the
    // bars' size, same run, against ferry's sleeping consumer and the bar it misses.
    for line in sleeping_floor(&rows) {
        say(&mut out.markdown, &line);
    }

    // The floor under any consumer that sleeps until its message comes, same run.
    let floor: Vec<f64> = v["wake_floor_us"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default();
    if !floor.is_empty() {
        let f = Summary::of(&floor);
        out.records.push(
            Record::new("python", "wake-up floor", "us", f, 1, 0.0).param("messages", floor.len()),
        );
        let sleeping = find(&rows, "ferry", BIG, "handover").map(|s| s.median);
        let line = format!(
            "floor for a sleeping consumer (8 bytes through a pipe to a process blocked in read, \
             other CPU, no data moved), same run: median {} µs (p99 {}){}",
            num(f.median),
            num(f.p99),
            sleeping.map_or(String::new(), |s| format!(
                "; ferry's sleeping consumer at 64 MiB: {} µs, {}x the floor",
                num(s),
                num(s / f.median)
            ))
        );
        say(&mut out.markdown, &line);
    }

    // The binding's own cost: the same publish-and-receive loop in Rust and in Python.
    let py_rt: Vec<f64> = v["roundtrip_us"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default();
    let rust_rt = rust_roundtrip(ctx.pick(2000, 20000))?;
    let (p, r) = (Summary::of(&py_rt), Summary::of(&rust_rt));
    for (series, s, n) in [
        ("roundtrip python", p, py_rt.len()),
        ("roundtrip rust", r, rust_rt.len()),
    ] {
        out.records.push(
            Record::new("python", series, "us", s, 1, 0.0)
                .param("size", 64)
                .param("messages", n),
        );
    }
    let _ = writeln!(
        out.markdown,
        "\nPublish a 64-byte message and receive it, one thread, two domains of one process \
         ({} round trips each): Rust median {} µs (p99 {}), Python median {} µs (p99 {}).",
        py_rt.len(),
        num(r.median),
        num(r.p99),
        num(p.median),
        num(p.p99),
    );
    let line = format!(
        "the binding's own cost (small publish-receive round trip, Python minus Rust, medians): \
         {} µs; bar: at most 5 µs; {}",
        num(p.median - r.median),
        verdict(p.median - r.median <= 5.0)
    );
    say(&mut out.markdown, &line);
    Ok(out)
}

/// `handover.py`'s `small_roundtrip`, in Rust.
fn rust_roundtrip(n: usize) -> Result<Vec<f64>> {
    use ferry::{Group, PathConfig, Publisher, ServiceConfig, Subscriber};
    use std::time::{Duration, Instant};
    let group = Group::open(&format!("rsrt-{}", std::process::id()))?;
    let (a, b) = (group.join()?, group.join()?);
    let mut publisher = Publisher::offer(&a, "rt", ServiceConfig::default())?;
    let mut sub = Subscriber::open(&b, "rt", Duration::from_secs(10))?;
    publisher.wait_for_subscribers(1, Duration::from_secs(10))?;
    let path = a.path(PathConfig::default())?;
    let mut buf = path.alloc(64)?;
    buf.write_at(0, &[b'x'; 64]);
    let msg = buf.freeze();
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t0 = Instant::now();
        publisher.publish(&msg)?;
        drop(sub.recv_timeout(Duration::from_secs(1))?);
        out.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    Ok(out.split_off(n / 10))
}

fn markdown(rows: &[Row], skipped: &Value, version: &str) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## python: numpy arrays from one Python process to another (CPython {version})\n"
    );
    let _ = writeln!(
        md,
        "One-way latency in µs, producer's stamp just before the handover to the consumer's \
         stamp after it has the array (\"handover\") or has also summed every byte \
         (\"+read\"); the two take turns. Ratios are against ferry at the same size and series.\n"
    );
    let mut t = Table::new(&[
        "transport",
        "size",
        "handover median",
        "p99",
        "vs ferry",
        "+read median",
        "p99",
        "vs ferry",
    ]);
    let mut seen: Vec<(String, u64)> = Vec::new();
    for r in rows {
        if !seen.contains(&(r.0.clone(), r.1)) {
            seen.push((r.0.clone(), r.1));
        }
    }
    seen.sort_by_key(|k| k.1);
    for (tr, size) in &seen {
        let mut cells = vec![tr.clone(), bytes(*size as usize)];
        for series in ["handover", "handover+read"] {
            match (
                find(rows, tr, *size, series),
                find(rows, "ferry", *size, series),
            ) {
                (Some(s), f) => {
                    cells.push(num(s.median));
                    cells.push(num(s.p99));
                    cells.push(f.map_or("n/a".into(), |f| ratio(s.median / f.median)));
                }
                (None, _) => cells.extend(["n/a".into(), "n/a".into(), "n/a".into()]),
            }
        }
        t.row(cells);
    }
    md.push_str(&t.render());
    if let Some(m) = skipped.as_object() {
        md.push('\n');
        for (k, why) in m {
            let _ = writeln!(md, "- {k}: {}", why.as_str().unwrap_or("skipped"));
        }
    }
    md
}

/// The 64 MiB array size of the bars.
const BIG: u64 = 64 << 20;

/// One measured row: transport, size, series and its summary.
type Row = (String, u64, String, Summary);

/// The summary of `transport`'s `series` at `size`, if measured.
fn find(rows: &[Row], transport: &str, size: u64, series: &str) -> Option<Summary> {
    rows.iter()
        .find(|r| r.0 == transport && r.1 == size && r.2 == series)
        .map(|r| r.3)
}

/// A result line: printed on stdout (`python: ...`) and added to the report as a bullet.
fn say(md: &mut String, line: &str) {
    println!("python: {line}");
    let _ = writeln!(md, "- {line}");
}

/// One line per bar on the 64 MiB hand-over (medians of the same run), for
/// the hand-over series and, as information, the series where the consumer reads it all.
fn bars(rows: &[Row]) -> Vec<String> {
    let find = |tr: &str, series: &str| find(rows, tr, BIG, series);
    let mut out = Vec::new();
    // ferry with a sleeping consumer (`recv`), the bars' subject; then ferry with a polling
    // consumer (`recv(spin=...)`), which waits the way iceoryx2's Python consumer does. The
    // +read series is information, for the sleeping consumer only.
    for (me, series) in [
        ("ferry", "handover"),
        ("ferry-poll", "handover"),
        ("ferry", "handover+read"),
    ] {
        let Some(f) = find(me, series) else {
            out.push(format!(
                "64 MiB {series}: {me} not measured; bars not checked"
            ));
            continue;
        };
        let bar = series == "handover";
        for (other, at_least) in [
            ("multiprocessing.Queue", 100.0),
            ("shared_memory+Queue", 10.0),
            ("iceoryx2", 1.0),
        ] {
            let Some(o) = find(other, series) else {
                out.push(format!(
                    "64 MiB {series} vs {other}: not measured (see skipped)"
                ));
                continue;
            };
            let x = o.median / f.median;
            let head = format!(
                "64 MiB {series}: {me} {} µs vs {other} {} µs (medians): {}x",
                num(f.median),
                num(o.median),
                num(x)
            );
            if !bar {
                out.push(format!(
                    "{head} (information: the bars are on the hand-over)"
                ));
                continue;
            }
            let want = if at_least > 1.0 {
                format!("at least {at_least}x faster")
            } else {
                "no slower".to_string()
            };
            out.push(format!("{head}; bar: {want}; {}", verdict(x >= at_least)));
        }
    }
    out
}

/// The transport name of the pipe-wake floor in `handover.py`.
const PIPE_WAKE: &str = "floor: pipe wake";

/// Lines comparing ferry's sleeping consumer with the pipe-wake floor at 64 MiB, and what
/// that floor leaves of the bar against `shared_memory`+queue.
fn sleeping_floor(rows: &[Row]) -> Vec<String> {
    let (Some(floor), Some(ferry)) = (
        find(rows, PIPE_WAKE, BIG, "handover"),
        find(rows, "ferry", BIG, "handover"),
    ) else {
        return vec!["64 MiB: the pipe-wake floor or ferry was not measured".into()];
    };
    let mut out = vec![format!(
        "64 MiB floor for a sleeping consumer (the producer writes the array, then wakes the \
         consumer through a pipe; 8 bytes cross), same rounds: median {} µs; ferry's \
         sleeping consumer {} µs, {}x that floor",
        num(floor.median),
        num(ferry.median),
        num(ferry.median / floor.median)
    )];
    if let Some(shm) = find(rows, "shared_memory+Queue", BIG, "handover") {
        let best = shm.median / floor.median;
        out.push(format!(
            "64 MiB: the floor alone is {}x faster than shared_memory+Queue ({} µs): {}",
            num(best),
            num(shm.median),
            if best < 10.0 {
                "no consumer that sleeps can meet the 10x bar in this run; a polling one can"
            } else {
                "the 10x bar is within a sleeping consumer's reach in this run"
            }
        ));
    }
    out
}

/// Median one-way latency against the payload size, one line per system and series.
fn plot(rows: &[Row]) -> PlotSpec {
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for (tr, size, s, sum) in rows {
        let label = format!("{tr} {s}");
        match series.iter_mut().find(|x| x.0 == label) {
            Some(x) => x.1.push((*size as f64, sum.median)),
            None => series.push((label, vec![(*size as f64, sum.median)])),
        }
    }
    for s in &mut series {
        s.1.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    PlotSpec {
        stem: "python".into(),
        title: "numpy array from one Python process to another: median one-way latency".into(),
        x_label: "array size (bytes)".into(),
        y_label: "µs".into(),
        series,
        log_x: true,
        log_y: true,
    }
}
