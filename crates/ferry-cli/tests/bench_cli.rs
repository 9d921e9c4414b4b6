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

#[test]
fn fbufs_quick_writes_records_and_a_plot() {
    let dir = scratch("fbufs");
    let json = dir.join("r.json");
    let svg = dir.join("p.svg");
    let child = ferry()
        .args(["bench", "fbufs", "--quick", "--json"])
        .arg(&json)
        .arg("--plot")
        .arg(&svg)
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
    let stdout = String::from_utf8_lossy(&out.stdout);
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
