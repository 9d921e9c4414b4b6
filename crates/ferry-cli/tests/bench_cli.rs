//! The `ferry bench` harness end to end: real worker processes, JSON records,
//! SVG plots, and clean failures.

use std::path::PathBuf;
use std::process::Command;

fn ferry() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferry"));
    cmd.env("CI", "true");
    cmd
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ferry-cli-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `ferry ARGS...`, asserts it succeeded, and returns its pid and stdout.
fn run_ok(args: &[&std::ffi::OsStr]) -> (u32, String) {
    let child = ferry()
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
        "bench".as_ref(),
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
    assert!(slopes.iter().all(|r| r["value"].as_f64().unwrap() > 0.0));
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
    let out = ferry().args(["bench", "nope"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("fbufs-path"));
}

#[test]
fn worker_refuses_a_descriptor_it_did_not_inherit() {
    let plan = r#"{"pattern":"stream","wait":"block","touch":"word","sizes":[4096],"msgs":[1],"warmup":[0],"trials":1}"#;
    let out = ferry()
        .args(["__worker", "sink", "--plan", plan, "--rx", "987"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not open"));
}

/// Groups a run of the `ferry` process `pid` left in /dev/shm.
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
fn calibrate_writes_a_file_the_library_reads() {
    let dir = scratch("calibrate");
    let file = dir.join("sub").join("calibration");
    let (pid, stdout) = run_ok(&[
        "calibrate".as_ref(),
        "--quick".as_ref(),
        "--out".as_ref(),
        file.as_os_str(),
    ]);
    assert!(stdout.contains("Tables 6 and 7") && stdout.contains("TCOW-fault bar"));
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.starts_with("# ferry calibration, written by `ferry calibrate` on "));
    let cal = ferry::semantics::Calibration::parse(&text).unwrap();
    // The primitives that need no privilege or kernel option are always there.
    for p in [
        "copy_in",
        "copy_in_local",
        "copy_out",
        "handover",
        "protect_mprotect",
        "hide",
        "swap",
    ] {
        let f = cal.fits.get(p).unwrap_or_else(|| panic!("no fit for {p}"));
        assert!(
            f.r2.is_finite() && f.a.is_finite() && f.b.is_finite(),
            "{p}: {f:?}"
        );
    }
    // The model answers for every semantics whose primitives were measured.
    for s in ferry::semantics::Semantics::ALL {
        let terms = cal.recipe(s, 1 << 20);
        if terms.iter().all(|t| cal.fits.contains_key(t.primitive)) {
            assert!(cal.predict(s, 1 << 20).is_some(), "{s}");
        }
    }
    assert!(
        groups_left(pid).is_empty(),
        "left behind: {:?}",
        groups_left(pid)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn genie_quick_measures_every_semantics_and_judges_the_bars() {
    let dir = scratch("genie");
    let json = dir.join("r.json");
    let (pid, stdout) = run_ok(&[
        "bench".as_ref(),
        "genie".as_ref(),
        "--quick".as_ref(),
        "--json".as_ref(),
        json.as_os_str(),
    ]);
    assert!(stdout.contains("Table 7") && stdout.contains("The bars of issue 10"));
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
