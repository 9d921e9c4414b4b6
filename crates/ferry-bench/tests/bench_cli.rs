//! The `ferry-bench` harness end to end: real worker processes, JSON records,
//! SVG plots, and clean failures.

use std::path::PathBuf;
use std::process::Command;

fn ferry_bench() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferry-bench"));
    cmd.env("CI", "true");
    cmd
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ferry-bench-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `ferry-bench ARGS...`, asserts it succeeded, and returns its pid and stdout.
fn run_ok(args: &[&std::ffi::OsStr]) -> (u32, String) {
    let child = ferry_bench()
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (pid, String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn fbufs_quick_writes_records_and_a_plot() {
    let dir = scratch("fbufs");
    let json = dir.join("r.json");
    let svg = dir.join("p.svg");
    let (pid, stdout) = run_ok(&[
        "fbufs".as_ref(),
        "--quick".as_ref(),
        "--json".as_ref(),
        json.as_os_str(),
        "--plot".as_ref(),
        svg.as_os_str(),
    ]);
    assert!(stdout.contains("Table 5.1") && stdout.contains("316"));

    let records: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for key in [
        "bench", "series", "params", "unit", "value", "median", "p99", "min", "max", "trials",
    ] {
        assert!(
            records.iter().all(|r| r.get(key).is_some()),
            "a record lacks {key}"
        );
    }
    let slopes: Vec<_> = records.iter().filter(|r| r["unit"] == "µs/page").collect();
    assert_eq!(slopes.len(), 6, "one per-page slope per transport");
    // A fitted slope is a number; its sign is a measurement (ferry's is near zero and can
    // come out negative on a busy machine), so the test does not judge it.
    assert!(slopes
        .iter()
        .all(|r| r["value"].as_f64().is_some_and(f64::is_finite)));
    for t in ["pipe", "unix", "ferry", "ferry-secured", "ferry-uncached"] {
        assert!(
            slopes.iter().any(|r| r["params"]["transport"] == t),
            "no slope for {t}"
        );
    }
    let ferry = slopes
        .iter()
        .find(|r| r["params"]["transport"] == "ferry")
        .unwrap();
    assert!(ferry["params"]["syscalls_per_call_sender"].is_number());
    // Every group this run created is gone.
    let prefix = format!("ferry.bench-{pid}-");
    let left: Vec<_> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn unknown_benchmark_is_an_error() {
    let out = ferry_bench().arg("nope").output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope"));
}

/// The suites `--help` lists: the names at the start of its command lines.
fn listed_suites() -> Vec<String> {
    let out = ferry_bench().arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let commands = text
        .split("Commands:")
        .nth(1)
        .unwrap_or_else(|| panic!("no command list in: {text}"));
    commands
        .lines()
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

#[test]
fn help_lists_exactly_the_suites_and_all() {
    let want = [
        "fbufs",
        "fbufs-path",
        "container",
        "xlate",
        "vcm",
        "services",
        "calibrate",
        "genie",
        "python",
        "handover",
        "hugepages",
        "adc",
        "bridge",
        "frames",
        "all",
        "help",
    ];
    assert_eq!(listed_suites(), want);
    // Each listed suite runs as a command of its own (here only as far as its --help).
    for name in &want[..want.len() - 1] {
        let out = ferry_bench().args([name, "--help"]).output().unwrap();
        assert!(out.status.success(), "{name}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("--quick"),
            "{name}"
        );
    }
}

#[test]
fn worker_refuses_a_descriptor_it_did_not_inherit() {
    let plan = r#"{"pattern":"stream","wait":"block","touch":"word","sizes":[4096],"msgs":[1],"warmup":[0],"trials":1}"#;
    let out = ferry_bench()
        .args(["__worker", "sink", "--plan", plan, "--rx", "987"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not open"));
}

/// Groups a run of the `ferry-bench` process `pid` left in /dev/shm.
fn groups_left(pid: u32) -> Vec<String> {
    let prefixes = [
        format!("ferry.bench-{pid}-"),
        format!("ferry.calib-{pid}-"),
        format!("ferry.genie-tcp-{pid}-"),
    ];
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| prefixes.iter().any(|p| n.starts_with(p)))
        .collect()
}

#[test]
fn genie_quick_measures_every_semantics_and_judges_the_bars() {
    let dir = scratch("genie");
    let json = dir.join("r.json");
    let (pid, stdout) = run_ok(&[
        "genie".as_ref(),
        "--quick".as_ref(),
        "--json".as_ref(),
        json.as_os_str(),
    ]);
    assert!(stdout.contains("Table 7") && stdout.contains("The bars, judged on this run"));
    let records: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for s in ferry::semantics::Semantics::ALL {
        let points: Vec<_> = records
            .iter()
            .filter(|r| r["bench"] == "genie" && r["series"] == s.name())
            .collect();
        assert!(!points.is_empty(), "no points for {s}");
        for p in &points {
            assert!(p["value"].as_f64().unwrap() > 0.0, "{s}: {p}");
            // Every output of the run is counted by the semantics layer.
            assert!(p["params"]["outputs"].as_u64().unwrap() > 0, "{s}: {p}");
            // The source took the run's thresholds from the calibration file it was given
            // (`__worker --calibration`), not the library's defaults.
            assert!(
                p["params"]["thresholds-from-file"].as_u64().unwrap() > 0,
                "{s}: {p}"
            );
        }
    }
    let bars: Vec<_> = records.iter().filter(|r| r["series"] == "bar").collect();
    assert!(bars.len() >= 4, "{bars:?}");
    assert!(bars.iter().all(|b| b["params"]["met"].is_boolean()));
    assert!(
        groups_left(pid).is_empty(),
        "left behind: {:?}",
        groups_left(pid)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
